"""The typed HTTP client of the ``/v1`` API (what the CLI uses when ``STACKFLOW_API_URL`` is
set, and what another service may use): one method per call, the API's own pydantic models
in and out, problem+json answers raised as :mod:`stackflow.client.errors`.

Every call has a bounded timeout; a run's event stream waits for events without a read
timeout (NDJSON has no keep-alives) and, should the connection drop, resumes after the last
event it got, so no event is lost or repeated. A start carries an ``Idempotency-Key``
(a fresh one unless given) and is sent once more with it after a transport error, so it
is applied once. Imports neither temporalio nor fastapi.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from stackflow.api.models import (
    DriftScheduleRequest,
    DriftScheduleView,
    DriftStatus,
    NotificationTargetView,
    PolicyView,
    ReleaseExport,
    ReleaseImport,
    ReleaseImported,
    RunCreated,
    RunPage,
    RunRequest,
    RunView,
    SourceView,
    StepRequest,
    StepResult,
    UnlockRequest,
)
from stackflow.client.errors import (
    ApiInvalid,
    ApiProtocolError,
    ApiUnavailable,
    error_for,
)
from stackflow.client.stream import parse_event, parse_header
from stackflow.core.refs import StackRef
from stackflow.model.events import EventType, RunEvent, StreamHeader
from stackflow.model.notifications import Destination
from stackflow.model.release import Unlocked
from stackflow.model.source import GitSource
from stackflow.policy_gate.bundle import PolicyBundle

M = TypeVar("M", bound=BaseModel)

TIMEOUT = 60.0
"""Seconds for one call (connect, each read, write): the API answers a step within 30 s."""
CONNECT_TIMEOUT = 10.0
STREAM_RETRIES = 5
"""Reconnects of one event stream after its connection dropped (backing off up to 5 s)."""
URL_ENV = "STACKFLOW_API_URL"
TOKEN_ENV = "STACKFLOW_API_TOKEN"
STEPS = ("approve", "reject", "retry", "abort", "cancel")


class EventStream:
    """A run's events, in order, each once, ending after ``run_complete`` (or, with
    ``wait=False``, with what exists now). ``header`` is the stream's first line, set once
    the first line has been read. Iterate it, or use it as a context manager to close it
    early."""

    def __init__(
        self, client: StackflowClient, stack: StackRef, run_id: str, after: int, wait: bool
    ) -> None:
        self._client, self._stack, self._run_id = client, stack, run_id
        self._after, self._wait = after, wait
        self.header: StreamHeader | None = None
        self._response: httpx.Response | None = None
        self._done = False

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._done = True
        if self._response is not None:
            self._response.close()
            self._response = None

    def __iter__(self) -> Iterator[RunEvent]:
        drops = 0
        while not self._done:
            try:
                for event in self._read():
                    drops = 0
                    yield event
                    self._after = event.seq
                    if event.type == EventType.run_complete:
                        self.close()
                        return
                self.close()  # the server ended the stream (wait=False, or it went away)
                return
            except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
                self._discard()
                drops += 1
                if drops > STREAM_RETRIES:
                    raise ApiUnavailable(
                        f"event stream of run {self._run_id} at {self._client.base_url} "
                        f"dropped {drops} times ({type(exc).__name__}: {exc})"
                    ) from None
                time.sleep(min(0.5 * 2 ** (drops - 1), 5.0))

    def _discard(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response = None

    def _read(self) -> Iterator[RunEvent]:
        params: dict[str, Any] = {"after": self._after}
        if not self._wait:
            params["wait"] = "false"
        timeout = httpx.Timeout(
            TIMEOUT, connect=CONNECT_TIMEOUT, read=None if self._wait else TIMEOUT
        )
        path = f"{self._client.stack_path(self._stack)}/runs/{self._run_id}/events"
        request = self._client.http.build_request(
            "GET", path, params=params, headers={"Accept": "application/x-ndjson"}, timeout=timeout
        )
        response = self._client.http.send(request, stream=True)
        self._response = response
        if response.status_code >= 400:
            response.read()
            raise self._client.problem(response)
        lines = response.iter_lines()
        for line in lines:
            if not line.strip():
                continue
            header = parse_header(line)
            if self.header is None:
                self.header = header
            break
        for line in lines:
            if line.strip():
                yield parse_event(line)


class StackflowClient:
    """A client of one stackflow API (``base_url`` such as ``http://127.0.0.1:18082``) with
    one bearer token. ``StackflowClient.from_env()`` reads ``STACKFLOW_API_URL`` and
    ``STACKFLOW_API_TOKEN``. Close it (or use ``with``) when done."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "stackflow-client/1"},
            timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT),
            transport=transport,
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> StackflowClient:
        env = os.environ if environ is None else environ
        url, token = env.get(URL_ENV, "").strip(), env.get(TOKEN_ENV, "").strip()
        if not url:
            raise ApiInvalid(f"{URL_ENV} is not set: the address of `stackflow serve`")
        if not token:
            raise ApiInvalid(
                f"{URL_ENV} is set but {TOKEN_ENV} is not: set it to an API token "
                f"(or unset {URL_ENV} to work directly against Temporal)"
            )
        return cls(url, token)

    def __enter__(self) -> StackflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # ---- plumbing ------------------------------------------------------------------------
    @staticmethod
    def stack_path(stack: StackRef) -> str:
        return f"/v1/stacks/{stack.project}/{stack.workspace}"

    def problem(self, response: httpx.Response) -> Exception:
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        return error_for(response.status_code, body, response.text)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The JSON body of a successful answer (None for a 204); the problem raised
        otherwise."""
        try:
            response = self.http.request(method, path, json=json, params=params, headers=headers)
        except httpx.TransportError as exc:
            raise ApiUnavailable(
                f"stackflow API at {self.base_url} unreachable ({type(exc).__name__}: "
                f"{' '.join(str(exc).split()) or 'no answer'})"
            ) from None
        if response.status_code >= 400:
            raise self.problem(response)
        if response.status_code == 204:
            return None
        try:
            return response.json()
        except ValueError:
            raise ApiProtocolError(
                f"{method} {path}: the answer is not JSON ({response.text[:80]!r})"
            ) from None

    @staticmethod
    def model(cls: type[M], data: Any) -> M:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ApiProtocolError(f"unexpected {cls.__name__}: {where}: {first['msg']}") from None

    # ---- runs ----------------------------------------------------------------------------
    def start_run(
        self, stack: StackRef, request: RunRequest, idempotency_key: str | None = None
    ) -> RunCreated:
        """Start a run (201, or 200 with the run an earlier start with the key made). Sent a
        second time with the same key when the first attempt got no answer."""
        key = idempotency_key or f"stackflow-client-{uuid.uuid4().hex}"
        body = request.model_dump(mode="json", exclude_unset=True)
        body["operation"] = request.operation.value
        path = f"{self.stack_path(stack)}/runs"
        try:
            data = self.request("POST", path, json=body, headers={"Idempotency-Key": key})
        except ApiUnavailable as exc:
            if exc.status:  # the server answered (a 503 says what to do): no second try
                raise
            time.sleep(1.0)
            data = self.request("POST", path, json=body, headers={"Idempotency-Key": key})
        return self.model(RunCreated, data)

    def list_runs(
        self, stack: StackRef, page_size: int = 20, page_token: str | None = None
    ) -> RunPage:
        params: dict[str, Any] = {"page_size": page_size}
        if page_token:
            params["page_token"] = page_token
        return self.model(
            RunPage, self.request("GET", f"{self.stack_path(stack)}/runs", params=params)
        )

    def get_run(self, stack: StackRef, run_id: str) -> RunView:
        return self.model(RunView, self.request("GET", f"{self.stack_path(stack)}/runs/{run_id}"))

    def preview(self, stack: StackRef, run_id: str) -> dict[str, Any]:
        """The run's preview (changes and summary), sensitive values masked."""
        data = self.request("GET", f"{self.stack_path(stack)}/runs/{run_id}/preview")
        if not isinstance(data, dict):
            raise ApiProtocolError("the preview is not an object")
        return data

    def step(
        self,
        stack: StackRef,
        run_id: str,
        action: str,
        comment: str | None = None,
        idempotency_key: str | None = None,
    ) -> StepResult:
        """``approve``, ``reject``, ``retry``, ``abort`` or ``cancel`` the run (applied once
        per ``idempotency_key``; a fresh one unless given)."""
        if action not in STEPS:
            raise ValueError(f"{action}: not a step ({', '.join(STEPS)})")
        key = idempotency_key or f"stackflow-client-{uuid.uuid4().hex}"
        data = self.request(
            "POST",
            f"{self.stack_path(stack)}/runs/{run_id}/{action}",
            json=StepRequest(comment=comment).model_dump(mode="json"),
            headers={"Idempotency-Key": key},
        )
        return self.model(StepResult, data)

    def approve(self, stack: StackRef, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "approve", comment)

    def reject(self, stack: StackRef, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "reject", comment)

    def retry(self, stack: StackRef, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "retry", comment)

    def abort(self, stack: StackRef, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "abort", comment)

    def cancel(self, stack: StackRef, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "cancel", comment)

    def events(
        self, stack: StackRef, run_id: str, after: int = 0, wait: bool = True
    ) -> EventStream:
        """The run's event stream after ``after`` (see :class:`EventStream`)."""
        return EventStream(self, stack, run_id, after, wait)

    # ---- releases ------------------------------------------------------------------------
    def releases(self, stack: StackRef) -> list[dict[str, Any]]:
        """The stack's releases, newest first, without spec and state."""
        data = self.request("GET", f"{self.stack_path(stack)}/releases")
        if not isinstance(data, list):
            raise ApiProtocolError("the release list is not a list")
        return data

    def release(self, stack: StackRef, revision: int) -> dict[str, Any]:
        """One release with its spec and state, sensitive values masked."""
        return self._object(f"{self.stack_path(stack)}/releases/{revision}")

    def release_diff(self, stack: StackRef, old: int, new: int) -> dict[str, Any]:
        return self._object(f"{self.stack_path(stack)}/releases/{old}/diff/{new}")

    def outputs(self, stack: StackRef) -> dict[str, Any]:
        return self._object(f"{self.stack_path(stack)}/outputs")

    def unlock(self, stack: StackRef, force: bool = False) -> Unlocked:
        """Free a stack whose run ended without releasing it (ApiStackLocked while that run
        is open, unless ``force``). Needs the approver role."""
        body = UnlockRequest(force=force).model_dump(mode="json")
        return self.model(
            Unlocked, self.request("POST", f"{self.stack_path(stack)}/unlock", json=body)
        )

    def import_releases(self, project: str, request: ReleaseImport) -> ReleaseImported:
        """Import releases into the project's stacks, which must have none (ApiConflict
        otherwise; nothing is written). Needs the approver role."""
        data = self.request(
            "POST", f"/v1/projects/{project}/releases/import", json=request.model_dump(mode="json")
        )
        return self.model(ReleaseImported, data)

    def export_releases(self, project: str, workspace: str | None = None) -> ReleaseExport:
        """The project's stacks' releases (or one workspace's) in Kusion's file form, masked."""
        params = {"workspace": workspace} if workspace else None
        data = self.request("GET", f"/v1/projects/{project}/releases/export", params=params)
        return self.model(ReleaseExport, data)

    # ---- drift ---------------------------------------------------------------------------
    def schedule_drift(self, stack: StackRef, request: DriftScheduleRequest) -> DriftScheduleView:
        """Check the stack for drift on a schedule, replacing its schedule if it has one."""
        data = self.request(
            "PUT", f"{self.stack_path(stack)}/drift/schedule", json=request.model_dump(mode="json")
        )
        return self.model(DriftScheduleView, data)

    def unschedule_drift(self, stack: StackRef) -> None:
        """Delete the stack's drift schedule (ApiNotFound when it has none)."""
        self.request("DELETE", f"{self.stack_path(stack)}/drift/schedule")

    def drift_status(self, stack: StackRef) -> DriftStatus:
        """The stack's last drift report (ApiNotFound before its first check)."""
        return self.model(DriftStatus, self.request("GET", f"{self.stack_path(stack)}/drift"))

    # ---- git sources and notification destinations -----------------------------------------
    def set_source(self, stack: StackRef, source: GitSource) -> SourceView:
        """Bind the stack to a git source (replacing its binding); the answer has no secret.
        Needs the approver role."""
        data = self.request(
            "PUT", f"{self.stack_path(stack)}/source", json=source.model_dump(mode="json")
        )
        return self.model(SourceView, data)

    def source(self, stack: StackRef) -> SourceView:
        """The stack's git source (ApiNotFound when it has none)."""
        return self.model(SourceView, self.request("GET", f"{self.stack_path(stack)}/source"))

    def unset_source(self, stack: StackRef) -> None:
        """Unbind the stack from its git source (ApiNotFound when it has none)."""
        self.request("DELETE", f"{self.stack_path(stack)}/source")

    def set_notification(
        self, project: str, name: str, destination: Destination
    ) -> NotificationTargetView:
        """Add the project's destination ``name``, or replace the one of that name; the
        answer has no secret. Needs the approver role."""
        data = self.request(
            "PUT",
            f"/v1/projects/{project}/notifications/{name}",
            json=destination.model_dump(mode="json"),
        )
        return self.model(NotificationTargetView, data)

    def notification(self, project: str, name: str) -> NotificationTargetView:
        """One destination of the project (ApiNotFound when it has none of that name)."""
        data = self.request("GET", f"/v1/projects/{project}/notifications/{name}")
        return self.model(NotificationTargetView, data)

    def notifications(self, project: str) -> list[NotificationTargetView]:
        """The project's destinations, in order, without secrets."""
        data = self.request("GET", f"/v1/projects/{project}/notifications")
        if not isinstance(data, list):
            raise ApiProtocolError("the destination list is not a list")
        return [self.model(NotificationTargetView, d) for d in data]

    def remove_notification(self, project: str, name: str) -> None:
        """Remove the project's destination ``name`` (ApiNotFound when it has none)."""
        self.request("DELETE", f"/v1/projects/{project}/notifications/{name}")

    # ---- policy bundles --------------------------------------------------------------------
    def push_policy(self, project: str, bundle: PolicyBundle) -> PolicyView:
        """Store the project's policy bundle (every later run evaluates it). Needs the
        approver role."""
        data = self.request(
            "PUT", f"/v1/projects/{project}/policy", json=bundle.model_dump(mode="json")
        )
        return self.model(PolicyView, data)

    def policy(self, project: str) -> PolicyView:
        """The project's policy bundle (ApiNotFound when it has none)."""
        return self.model(PolicyView, self.request("GET", f"/v1/projects/{project}/policy"))

    def healthz(self) -> dict[str, Any]:
        return self._object("/v1/healthz")

    def _object(self, path: str) -> dict[str, Any]:
        data = self.request("GET", path)
        if not isinstance(data, dict):
            raise ApiProtocolError(f"GET {path}: the answer is not an object")
        return data
