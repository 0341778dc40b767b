"""The state backend's one SQL schema (SQLAlchemy Core), shared by SQLite and PostgreSQL.

Migrations under ``migrations/versions`` create exactly these tables; a test checks that
the migrated database and this module agree.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

HEAD_REVISION = "0012"
"""The newest migration under ``migrations/versions`` (a test holds it to Alembic's head):
a database at it needs no migration, and opening one checks it without loading Alembic."""
VERSION_TABLE = "alembic_version"
"""Where Alembic keeps the migration a database is at."""

_STACK = (
    sa.Column("project", sa.String(200), primary_key=True),
    sa.Column("workspace", sa.String(200), primary_key=True),
)


def _stack() -> list[sa.Column[str]]:
    return [c._copy() for c in _STACK]


releases = sa.Table(
    "releases",
    metadata,
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
    sa.Column("source_revision", sa.Integer),
    sa.Column("source", sa.JSON),
    sa.Column("policy", sa.JSON),
    sa.Column("set_run", sa.String(300)),
)
"""One row per release (Kusion's fields); the spec lives in ``blobs`` by ``spec_ref``."""

release_resources = sa.Table(
    "release_resources",
    metadata,
    *_stack(),
    sa.Column("revision", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("resource_id", sa.String(1000), primary_key=True),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Index("ix_release_resources_order", "project", "workspace", "revision", "position"),
)
"""The state of each resource of a release, written as each node finishes (JSON text)."""

stack_locks = sa.Table(
    "stack_locks",
    metadata,
    *_stack(),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("operation", sa.String(20), nullable=False),
    sa.Column("workflow_id", sa.String(400)),
    sa.Column("run_id", sa.String(100)),
    sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
)
"""Who holds a stack: the run of its release in progress. Every state write checks it."""

blobs = sa.Table(
    "blobs",
    metadata,
    sa.Column("ref", sa.String(80), primary_key=True),
    sa.Column("kind", sa.String(20), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("key_id", sa.String(64)),
)
"""Content-addressed specs, plans and diffs (zlib-compressed, then encrypted with ``key_id``
when keys are configured; the ref is the sha256 of the plain body)."""

terraform_states = sa.Table(
    "terraform_states",
    metadata,
    *_stack(),
    sa.Column("resource_id", sa.String(1000), primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("serial", sa.Integer, nullable=False),
    sa.Column("lineage", sa.String(100), nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("run_id", sa.String(100)),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)
"""The latest OpenTofu state of each Terraform resource, written right after every tofu
command that changes it, so a retry on another host never starts from nothing."""

terraform_plans = sa.Table(
    "terraform_plans",
    metadata,
    *_stack(),
    sa.Column("revision", sa.Integer, primary_key=True),
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
"""The plan files an apply's preview made for the release being applied (sealed like a
state, by its inputs' digest), each taken once by that release's apply of the same inputs."""

drift_reports = sa.Table(
    "drift_reports",
    metadata,
    *_stack(),
    sa.Column("checked_at", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("revision", sa.Integer),
    sa.Column("drifted", sa.Boolean, nullable=False),
    sa.Column("summary", sa.JSON, nullable=False),
    sa.Column("report_ref", sa.String(80)),
    sa.Column("workflow_id", sa.String(400)),
    sa.Column("run_id", sa.String(100)),
)
"""What each drift check found (``DriftWorkflow``): counts in ``summary``, every drifted
resource's diff (masked) in a blob by ``report_ref``. No lock: checks only read."""

run_events = sa.Table(
    "run_events",
    metadata,
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
"""Each run's event stream (:mod:`stackflow.model.events`): ``seq`` from 1 with no gap, assigned
under the run's own write lock so commit order is ``seq`` order; ``key`` (a sha256) makes an
append idempotent."""

project_policies = sa.Table(
    "project_policies",
    metadata,
    sa.Column("project", sa.String(200), primary_key=True),
    sa.Column("digest", sa.String(80), nullable=False),
    sa.Column("updated_by", sa.String(200)),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)
"""A project's policy bundle (its digest; the bundle is a blob): every later run of the
project evaluates it (:mod:`stackflow.policy_gate`)."""

run_keys = sa.Table(
    "run_keys",
    metadata,
    *_stack(),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("workflow_id", sa.String(400)),
    sa.Column("run_id", sa.String(64)),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
"""The API's ``Idempotency-Key`` claims: the request a key was first given with (its digest,
keyed like every digest of input that may hold secrets) and the run its start made (None
until the start is recorded)."""

stack_sources = sa.Table(
    "stack_sources",
    metadata,
    *_stack(),
    sa.Column("url", sa.String(2000), nullable=False),
    sa.Column("ref", sa.String(255), nullable=False),
    sa.Column("path", sa.String(1000), nullable=False),
    sa.Column("mode", sa.String(20), nullable=False),
    sa.Column("auto_approve", sa.Boolean, nullable=False),
    sa.Column("secret", sa.Text, nullable=False),
    sa.Column("updated_by", sa.String(200)),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)
"""A stack's git source (:class:`~stackflow.model.source.GitSource`); the webhook secret sealed
like every secret at rest."""

source_pushes = sa.Table(
    "source_pushes",
    metadata,
    *_stack(),
    sa.Column("url", sa.String(2000), nullable=False),
    sa.Column("commit", sa.String(40), nullable=False),
    sa.Column("pushed_at", sa.DateTime(timezone=True), nullable=False),
)
"""The commit of the last run a webhook delivery started for the stack (and its repository):
a later delivery must carry its branch's head or a commit newer than this one."""

notification_targets = sa.Table(
    "notification_targets",
    metadata,
    sa.Column("project", sa.String(200), primary_key=True),
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("url", sa.String(2000), nullable=False),
    sa.Column("secret", sa.Text, nullable=False),
    sa.Column("types", sa.JSON, nullable=False),
    sa.Column("position", sa.Integer, nullable=False),
)
"""A project's webhook destinations (:class:`~stackflow.model.notifications.NotificationTarget`),
the secret sealed."""

notification_failures = sa.Table(
    "notification_failures",
    metadata,
    sa.Column("project", sa.String(200), primary_key=True),
    sa.Column("target", sa.String(100), primary_key=True),
    sa.Column("event_id", sa.String(100), primary_key=True),
    sa.Column("type", sa.String(100), nullable=False),
    sa.Column("run_id", sa.String(100)),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False),
)
"""Deliveries that did not succeed within their retries (the dead-letter list)."""

onprem_paths = sa.Table(
    "onprem_paths",
    metadata,
    sa.Column("path", sa.String(4096), primary_key=True),
    sa.Column("project", sa.String(200), nullable=False),
    sa.Column("workspace", sa.String(200), nullable=False),
    sa.Column("resource_id", sa.String(1000), nullable=False),
    sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
)
"""Which stack owns each OnPrem path (its real path on the worker's host): claimed before
the path is first written, released when it is deleted; the primary key is what lets only
one of two stacks applying the same path at once win."""
