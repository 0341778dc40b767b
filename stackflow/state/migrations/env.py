"""Alembic environment: stackflow runs migrations in process on a connection it passes in."""

from __future__ import annotations

from alembic import context

from stackflow.state.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
