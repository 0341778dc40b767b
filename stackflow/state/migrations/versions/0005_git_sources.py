"""Git sources: releases record the commit they ran; stacks bound to a repository.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("source", sa.JSON))
    op.create_table(
        "stack_sources",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("workspace", sa.String(200), primary_key=True),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("ref", sa.String(255), nullable=False),
        sa.Column("path", sa.String(1000), nullable=False),
        sa.Column("mode", sa.String(20), nullable=False),
        sa.Column("auto_approve", sa.Boolean, nullable=False),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("updated_by", sa.String(200)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("stack_sources")
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("source")
