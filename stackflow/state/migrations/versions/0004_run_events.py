"""Each run's event stream.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_events",
        sa.Column("run_id", sa.String(100), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("project", sa.String(200), nullable=False),
        sa.Column("workspace", sa.String(200), nullable=False),
        sa.Column("workflow_id", sa.String(400), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.UniqueConstraint("run_id", "key", name="uq_run_events_key"),
    )


def downgrade() -> None:
    op.drop_table("run_events")
