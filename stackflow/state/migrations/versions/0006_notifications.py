"""Outbound notifications: a project's webhook destinations and the dead-letter list.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notification_targets",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("types", sa.JSON, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
    )
    op.create_table(
        "notification_failures",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("target", sa.String(100), primary_key=True),
        sa.Column("event_id", sa.String(100), primary_key=True),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("run_id", sa.String(100)),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("notification_failures")
    op.drop_table("notification_targets")
