"""Policy gate: a project's pushed policy bundle; the decision each release ran under.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("policy", sa.JSON))
    op.create_table(
        "project_policies",
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("updated_by", sa.String(200)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("project_policies")
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("policy")
