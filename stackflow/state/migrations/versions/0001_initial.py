"""Releases, per-release resource state, stack locks, blobs, Terraform states.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _stack() -> list[sa.Column[str]]:
    return [
        sa.Column("project", sa.String(200), primary_key=True),
        sa.Column("workspace", sa.String(200), primary_key=True),
    ]


def upgrade() -> None:
    op.create_table(
        "releases",
        *_stack(),
        sa.Column("revision", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("operation", sa.String(20), nullable=False),
        sa.Column("phase", sa.String(20), nullable=False),
        sa.Column("stack", sa.String(200)),
        sa.Column("spec_ref", sa.String(80)),
        sa.Column("error", sa.Text),
        sa.Column("approval", sa.JSON),
        sa.Column("changes", sa.JSON),
        sa.Column("workflow_id", sa.String(400)),
        sa.Column("run_id", sa.String(100)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "release_resources",
        *_stack(),
        sa.Column("revision", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("resource_id", sa.String(1000), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_index(
        "ix_release_resources_order",
        "release_resources",
        ["project", "workspace", "revision", "position"],
    )
    op.create_table(
        "stack_locks",
        *_stack(),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("operation", sa.String(20), nullable=False),
        sa.Column("workflow_id", sa.String(400)),
        sa.Column("run_id", sa.String(100)),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "blobs",
        sa.Column("ref", sa.String(80), primary_key=True),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "terraform_states",
        *_stack(),
        sa.Column("resource_id", sa.String(1000), primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("serial", sa.Integer, nullable=False),
        sa.Column("lineage", sa.String(100), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("run_id", sa.String(100)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    for table in ("terraform_states", "blobs", "stack_locks", "release_resources", "releases"):
        op.drop_table(table)
