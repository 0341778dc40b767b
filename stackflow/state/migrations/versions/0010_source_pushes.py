"""The last commit a webhook delivery ran per stack: a replayed old delivery is refused.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "source_pushes",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("workspace", sa.String(200), primary_key=True),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("commit", sa.String(40), nullable=False),
        sa.Column("pushed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("source_pushes")
