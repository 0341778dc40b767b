"""Releases remember the revision a rollback came from; drift reports.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("source_revision", sa.Integer))
    op.create_table(
        "drift_reports",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("workspace", sa.String(200), primary_key=True),
        sa.Column("checked_at", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("revision", sa.Integer),
        sa.Column("drifted", sa.Boolean, nullable=False),
        sa.Column("summary", sa.JSON, nullable=False),
        sa.Column("report_ref", sa.String(80)),
        sa.Column("workflow_id", sa.String(400)),
        sa.Column("run_id", sa.String(100)),
    )


def downgrade() -> None:
    op.drop_table("drift_reports")
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("source_revision")
