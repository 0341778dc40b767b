"""The set run that made a release (a stack set's member run), on the release.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("set_run", sa.String(300)))


def downgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("set_run")
