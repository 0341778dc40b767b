"""``stackflow serve``: the HTTP API (FastAPI on uvicorn) that starts and steers runs and
reads releases, for services that should not speak Temporal's gRPC with stackflow's codec.

Stateless: every answer comes from Temporal (runs, their queries and Updates, the
``Idempotency-Key`` of a start, kept in the run's memo) or the state backend (releases,
specs too big to travel inline), so any number of replicas can serve behind one address.
:func:`stackflow.api.app.create_app` builds the application from its dependencies.
"""
