"""OnPrem path ownership: which stack owns each path, so another stack's apply is refused.

The paths each stack's latest release records are claimed for it (as written in the spec:
the migration may run on a host other than the worker's, where paths resolve differently);
when two stacks record one path, the first found keeps it.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import json
import posixpath
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "onprem_paths",
        sa.Column("path", sa.String(4096), primary_key=True),
        sa.Column("project", sa.String(200), nullable=False),
        sa.Column("workspace", sa.String(200), nullable=False),
        sa.Column("resource_id", sa.String(1000), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
    )
    bind = op.get_bind()
    state = sa.table(
        "release_resources",
        sa.column("project", sa.String),
        sa.column("workspace", sa.String),
        sa.column("revision", sa.Integer),
        sa.column("resource_id", sa.String),
        sa.column("body", sa.Text),
    )
    latest = (
        sa.select(
            state.c.project,
            state.c.workspace,
            sa.func.max(state.c.revision).label("revision"),
        )
        .group_by(state.c.project, state.c.workspace)
        .subquery()
    )
    query = (
        sa.select(state.c.project, state.c.workspace, state.c.resource_id, state.c.body)
        .join(
            latest,
            sa.and_(
                state.c.project == latest.c.project,
                state.c.workspace == latest.c.workspace,
                state.c.revision == latest.c.revision,
            ),
        )
        .where(state.c.body.like('%"type":"OnPrem"%'))
        .order_by(state.c.project, state.c.workspace, state.c.resource_id)
    )
    claims: dict[str, dict[str, object]] = {}
    stamp = datetime.now(UTC)
    for row in bind.execute(query):
        try:
            doc = json.loads(row.body)
        except ValueError:
            continue
        path = (doc.get("attributes") or {}).get("path") if isinstance(doc, dict) else None
        if not isinstance(path, str) or not path.startswith("/"):
            continue
        claims.setdefault(
            posixpath.normpath(path),
            {
                "path": posixpath.normpath(path),
                "project": row.project,
                "workspace": row.workspace,
                "resource_id": row.resource_id,
                "claimed_at": stamp,
            },
        )
    if claims:
        op.bulk_insert(table, list(claims.values()))


def downgrade() -> None:
    op.drop_table("onprem_paths")
