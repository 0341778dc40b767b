"""The API's Idempotency-Key claims: a retried start finds its run without a visibility query.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_keys",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("workspace", sa.String(200), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("workflow_id", sa.String(400)),
        sa.Column("run_id", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_keys")
