"""OnPrem path ownership: which stack owns each path, so another stack's apply is refused.

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
        "onprem_paths",
        sa.Column("path", sa.String(4096), primary_key=True),
        sa.Column("project", sa.String(200), nullable=False),
        sa.Column("workspace", sa.String(200), nullable=False),
        sa.Column("resource_id", sa.String(1000), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("onprem_paths")
