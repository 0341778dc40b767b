"""``GET …/runs/{id}`` of a run whose event stream has ended waits for its workflow to close
(stackflow.api.runs.closed_if_ending), so a client that read ``run_complete`` gets the final
view in one request; a run not ending, or ended by Temporal's account, is not waited for."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.concurrency import run_in_threadpool
from temporalio.client import WorkflowExecutionStatus

from stackflow.api import runs
from stackflow.core.refs import StackRef
from stackflow.model.events import EventType, RunEvent

STACK = StackRef("p", "w")
RUNNING = SimpleNamespace(
    status=WorkflowExecutionStatus.RUNNING, run_id="r1", workflow_type="ApplyWorkflow"
)
CLOSED = SimpleNamespace(
    status=WorkflowExecutionStatus.COMPLETED, run_id="r1", workflow_type="ApplyWorkflow", id="w"
)


def last(type: EventType, **data: Any) -> RunEvent:
    return RunEvent.model_validate(
        {"seq": 9, "type": type, "time": "2026-11-26T08:00:00+00:00", "data": data}
    )


class Backend:
    def __init__(self, event: RunEvent | None) -> None:
        self.event = event

    def last_event(self, stack: StackRef, run_id: str) -> RunEvent | None:
        assert (stack, run_id) == (STACK, "r1")
        return self.event


class Handle:
    """Closes ``after`` seconds after the first wait (never: None)."""

    def __init__(self, after: float | None) -> None:
        self.after, self.waited, self.described = after, 0, 0

    async def result(self, follow_runs: bool = True) -> Any:
        self.waited += 1
        if self.after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.after)
        return {"phase": "succeeded"}

    async def describe(self) -> Any:
        self.described += 1
        return CLOSED


def ctx(event: RunEvent | None) -> Any:
    backend = Backend(event)

    async def state(fn: Any) -> Any:
        return await run_in_threadpool(fn)

    def final_result(handle: Handle, result_type: type) -> Any:
        return handle.result(follow_runs=False)  # ApiContext.final_result waits as this

    return SimpleNamespace(
        backend=backend, state=state, final_result=final_result, remember_run=lambda *_: None
    )


async def test_a_run_whose_stream_ended_is_answered_once_it_has_closed() -> None:
    handle = Handle(after=0.2)
    got = await runs.closed_if_ending(
        ctx(last(EventType.run_complete, status="succeeded")), STACK, handle, RUNNING
    )
    assert got is CLOSED and (handle.waited, handle.described) == (1, 1)


@pytest.mark.parametrize(
    "event",
    [
        None,
        last(EventType.apply_complete),
        last(EventType.run_complete, status="failed", source="temporal"),
    ],
    ids=["no events", "not ending", "ended by Temporal's account"],
)
async def test_a_run_not_ending_is_not_waited_for(event: RunEvent | None) -> None:
    handle = Handle(after=0.0)
    got = await runs.closed_if_ending(ctx(event), STACK, handle, RUNNING)
    assert got is RUNNING and handle.waited == 0


async def test_a_closed_run_is_not_looked_at_again() -> None:
    handle = Handle(after=0.0)
    got = await runs.closed_if_ending(ctx(None), STACK, handle, CLOSED)
    assert got is CLOSED and (handle.waited, handle.described) == (0, 0)


async def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "CLOSING_WAIT", 0.1)
    handle = Handle(after=None)
    got = await asyncio.wait_for(
        runs.closed_if_ending(ctx(last(EventType.run_complete)), STACK, handle, RUNNING), 5
    )
    assert got is RUNNING and handle.waited == 1


@pytest.mark.parametrize(
    "status",
    [
        runs.RPCStatusCode.FAILED_PRECONDITION,  # no worker polled the queue lately
        runs.RPCStatusCode.DEADLINE_EXCEEDED,
        runs.RPCStatusCode.CANCELLED,
    ],
)
def test_a_status_query_no_worker_answers_leaves_the_run_running_with_why(
    status: runs.RPCStatusCode,
) -> None:
    """Right after Temporal restarts, before the workers poll again, it refuses a query with
    FAILED_PRECONDITION: the view says the run did not answer (a following CLI asks again)
    instead of failing the request."""

    class Handle:
        async def query(self, *args: Any, **kwargs: Any) -> Any:
            raise runs.RPCError(
                "no poller seen for task queue recently, worker may be down", status, b""
            )

    view = runs.RunView(run_id="r1", workflow_id="w", operation="apply", status="running")
    asyncio.run(runs._running(Handle(), view))  # type: ignore[arg-type]
    assert view.error is not None and "did not answer the status query" in view.error
    assert "no poller seen" in view.error and view.phase is None


def test_a_status_query_refused_otherwise_is_an_error() -> None:
    class Handle:
        async def query(self, *args: Any, **kwargs: Any) -> Any:
            raise runs.RPCError("denied", runs.RPCStatusCode.PERMISSION_DENIED, b"")

    view = runs.RunView(run_id="r1", workflow_id="w", operation="apply", status="running")
    with pytest.raises(runs.RPCError):
        asyncio.run(runs._running(Handle(), view))  # type: ignore[arg-type]
