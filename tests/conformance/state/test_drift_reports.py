"""State conformance, DriftReportStore: reports per stack, newest first. Every backend (SQLite and
PostgreSQL: the ``backend`` fixture in tests/conftest.py) passes it."""

from __future__ import annotations

from typing import Any

import pytest

from stackflow.core.refs import StackRef
from stackflow.state.backend import StateBackend
from stackflow.state.protocols import DriftReportStore
from tests.conformance.state.common import R1, R2, STACK, narrow, res  # noqa: F401


@pytest.fixture
def backend(backend: StateBackend) -> Any:
    """The backend (SQLite, PostgreSQL) through the protocols this file tests only."""
    return narrow(backend, DriftReportStore)


def test_drift_reports_newest_first_and_idempotent(backend: StateBackend) -> None:
    from datetime import UTC, datetime, timedelta

    from stackflow.model.drift import DriftReport, DriftSummary

    assert backend.drift_reports(STACK) == []
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = DriftReport(
        project="p",
        workspace="w",
        checked_at=t0,
        revision=3,
        drifted=False,
        summary=DriftSummary(checked=2),
    )
    second = first.model_copy(
        update={
            "checked_at": t0 + timedelta(hours=1),
            "drifted": True,
            "summary": DriftSummary(checked=2, drifted=1, ids=["a"]),
            "report_ref": "sha256:" + "0" * 64,
            "repair_workflow_id": "stackflow/p/w",
        }
    )
    backend.put_drift_report(first)
    backend.put_drift_report(second)
    backend.put_drift_report(second)  # a retried activity writes the same row
    got = backend.drift_reports(STACK, limit=5)
    assert [r.drifted for r in got] == [True, False]
    assert got[0] == second and got[1] == first
    assert backend.drift_reports(StackRef("p", "other")) == []
