"""Blobs may be encrypted: the id of the key they were sealed with.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(sa.Column("key_id", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("key_id")
