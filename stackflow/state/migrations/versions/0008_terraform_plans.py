"""Saved Terraform plans: what an apply's preview planned, applied as it was previewed.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "terraform_plans",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("workspace", sa.String(200), primary_key=True),
        sa.Column("revision", sa.Integer, primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("terraform_plans")
