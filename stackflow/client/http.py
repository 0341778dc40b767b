"""The typed HTTP client of the ``/v1`` API (what the CLI uses when ``STACKFLOW_API_URL`` is
set, and what another service may use): one method per call, the light types of
:mod:`stackflow.client.types` out (a pydantic model or a dict in), problem+json answers
raised as :mod:`stackflow.client.errors`. Standard library only (``http.client`` through
:mod:`stackflow.client.transport`): no pydantic, httpx, temporalio or fastapi.

Every call has a bounded timeout; a run's event stream waits for events without a read
timeout (NDJSON has no keep-alives) and, should the connection drop, resumes after the last
event it got, so no event is lost or repeated. A start carries an ``Idempotency-Key``
(a fresh one unless given) and is sent once more with it after a transport error, so it
is applied once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from http.client import HTTPException
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode

from stackflow.client.errors import (
    ApiInvalid,
    ApiProtocolError,
    ApiUnavailable,
    error_for,
)
from stackflow.client.stream import parse_event, parse_header
from stackflow.client.transport import Answer, HttpTransport, Transport
from stackflow.client.types import (
    Invalid,
    NotificationTargetView,
    PolicyView,
    Record,
    RunCreated,
    RunEvent,
    RunPage,
    RunView,
    SourceView,
    Stack,
    StackLike,
    StepResult,
    StreamHeader,
    parse,
)

M = TypeVar("M")

TIMEOUT = 60.0
"""Seconds for one call (connect, each read, write): the API answers a step within 30 s."""
CONNECT_TIMEOUT = 10.0
STREAM_RETRIES = 5
BACKOFF_MAX = 5.0
"""The longest pause between two asks while an outage is waited out."""
"""Reconnects of one event stream after its connection dropped (backing off up to 5 s)."""
URL_ENV = "STACKFLOW_API_URL"
TOKEN_ENV = "STACKFLOW_API_TOKEN"
STEPS = ("approve", "reject", "retry", "abort", "cancel")
TRANSPORT_ERRORS = (OSError, HTTPException)
"""What a connection that failed or dropped raises (refused, reset, timed out, TLS, a
broken answer)."""


json_loads = json.loads


def _json_of(body: Any) -> Any:
    """A request body as JSON data: a pydantic model dumped (its set fields), else as given."""
    dump = getattr(body, "model_dump", None)
    return body if dump is None else dump(mode="json")


def transport_error(base_url: str, exc: BaseException) -> ApiUnavailable:
    text = " ".join(str(exc).split()) or "no answer"
    return ApiUnavailable(f"stackflow API at {base_url} unreachable ({type(exc).__name__}: {text})")


class EventStream:
    """A run's events, in order, each once, ending after ``run_complete`` (or, with
    ``wait=False``, with what exists now). ``header`` is the stream's first line, set once
    the first line has been read. Iterate it, or use it as a context manager to close it
    early."""

    def __init__(
        self,
        client: StackflowClient,
        stack: StackLike,
        run_id: str,
        after: int,
        wait: bool,
        path: str | None = None,
    ) -> None:
        self._client, self._stack, self._run_id = client, stack, run_id
        self._path = path or f"{client.stack_path(stack)}/runs/{run_id}/events"
        self._after, self._wait = after, wait
        self.header: StreamHeader | None = None
        self._answer: Answer | None = None
        self._done = False

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._done = True
        self._discard()

    def __iter__(self) -> Iterator[RunEvent]:
        drops = 0
        down_since: float | None = None
        while not self._done:
            try:
                for event in self._read():
                    drops, down_since = 0, None
                    yield event
                    self._after = event.seq
                    if event.type == "run_complete":
                        self.close()
                        return
                self.close()  # the server ended the stream (wait=False, or it went away)
                return
            except ApiUnavailable as exc:  # 503 on opening: the API cannot reach Temporal
                self._discard()
                now = time.monotonic()
                down_since = now if down_since is None else down_since
                if exc.status != 503 or now - down_since >= self._client.patience:
                    raise
                time.sleep(min(1.0, down_since + self._client.patience - now))
            except TRANSPORT_ERRORS as exc:
                self._discard()
                drops += 1
                if drops > STREAM_RETRIES:
                    raise ApiUnavailable(
                        f"event stream of run {self._run_id} at {self._client.base_url} "
                        f"dropped {drops} times ({type(exc).__name__}: {exc})"
                    ) from None
                time.sleep(min(0.5 * 2 ** (drops - 1), 5.0))

    def _discard(self) -> None:
        if self._answer is not None:
            self._answer.close()
            self._answer = None

    def _read(self) -> Iterator[RunEvent]:
        params: dict[str, Any] = {"after": self._after}
        if not self._wait:
            params["wait"] = "false"
        answer = self._client.transport.send(
            "GET",
            f"{self._path}?{urlencode(params)}",
            self._client.headers({"Accept": "application/x-ndjson"}),
            None,
            timeout=None if self._wait else self._client.timeout,
            stream=True,
        )
        self._answer = answer
        if answer.status >= 400:
            raise self._client.problem(answer.status, answer.read())
        lines = (line.decode("utf-8") for line in answer.lines() if line.strip())
        for line in lines:
            header = parse_header(line)
            if self.header is None:
                self.header = header
            break
        for line in lines:
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
        transport: Transport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token = token
        self.patience = 0.0
        """Seconds one outage is waited out (a 503: the API cannot reach Temporal), asking
        again with backoff; 0: the 503 is raised at once."""
        self.notice: Callable[[str], None] = lambda text: None
        """Told when an outage begins and when it ends (the CLI prints it on a terminal)."""
        self.transport: Transport = transport or HttpTransport(self.base_url, timeout)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StackflowClient:
        env = os.environ if environ is None else environ
        url, token = env.get(URL_ENV, "").strip(), env.get(TOKEN_ENV, "").strip()
        if not url:
            raise ApiInvalid(f"{URL_ENV} is not set: the address of `stackflow serve`")
        if not token:
            raise ApiInvalid(
                f"{URL_ENV} is set but {TOKEN_ENV} is not: set it to an API token "
                f"(or unset {URL_ENV} to work with the Temporal and state backend of this machine)"
            )
        try:
            return cls(url, token)
        except ValueError as exc:
            raise ApiInvalid(f"{URL_ENV}: {exc}") from None

    def __enter__(self) -> StackflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    # ---- plumbing ------------------------------------------------------------------------
    @staticmethod
    def stack_path(stack: StackLike) -> str:
        return f"/v1/stacks/{stack.project}/{stack.workspace}"

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {
            "Accept": "*/*",
            "Authorization": f"Bearer {self._token}",
            "User-Agent": "stackflow-client/1",
            **(extra or {}),
        }

    @staticmethod
    def problem(status: int, content: bytes) -> Exception:
        text = content.decode("utf-8", "replace")
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = None
        return error_for(status, body, text)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The JSON body of a successful answer (None for a 204); the problem raised
        otherwise."""
        body: bytes | None = None
        extra = dict(headers or {})
        if json is not None:
            import json as json_module

            body = json_module.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
            extra["Content-Type"] = "application/json"
        target = f"{path}?{urlencode(params)}" if params else path
        down_since: float | None = None
        delay = 0.5
        while True:
            try:
                answer = self.transport.send(
                    method, target, self.headers(extra), body, timeout=self.timeout
                )
                content = answer.read()
            except TRANSPORT_ERRORS as exc:
                self.transport.close()
                raise transport_error(self.base_url, exc) from None
            if answer.status != 503 or self.patience <= 0:
                break
            # every call that may be sent twice carries its Idempotency-Key: applied once
            now = time.monotonic()
            if down_since is None:
                down_since = now
                self.notice(
                    f"{self.problem(503, content)}; asking again for up to "
                    f"{self.patience:g}s (--unavailable-timeout)"
                )
            if now - down_since >= self.patience:
                break
            time.sleep(min(delay, down_since + self.patience - now))
            delay = min(delay * 2, BACKOFF_MAX)
        if down_since is not None and answer.status != 503:
            self.notice("Temporal answers again; continuing")
        if answer.status >= 400:
            raise self.problem(answer.status, content)
        if answer.status == 204:
            return None
        try:
            return json_loads(content)
        except ValueError:
            raise ApiProtocolError(
                f"{method} {path}: the answer is not JSON "
                f"({content.decode('utf-8', 'replace')[:80]!r})"
            ) from None

    @staticmethod
    def model(cls: type[M], data: Any) -> M:
        """``data`` as the light type ``cls`` (or a pydantic model's ``model_validate``);
        ApiProtocolError when it does not have the type's fields."""
        validate = getattr(cls, "model_validate", None)
        if validate is not None:
            from pydantic import ValidationError

            try:
                result: M = validate(data)
                return result
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ApiProtocolError(
                    f"unexpected {cls.__name__}: {where}: {first['msg']}"
                ) from None
        try:
            return cast(M, parse(cast(type[Record], cls), data))
        except Invalid as exc:
            raise ApiProtocolError(f"unexpected {cls.__name__}: {exc}") from None

    # ---- runs ----------------------------------------------------------------------------
    def start_run(
        self, stack: StackLike, request: Any, idempotency_key: str | None = None
    ) -> RunCreated:
        """Start a run (201, or 200 with the run an earlier start with the key made) with
        ``request``: the API's ``RunRequest`` (its set fields are sent) or its JSON. Sent a
        second time with the same key when the first attempt got no answer."""
        key = idempotency_key or f"stackflow-client-{os.urandom(16).hex()}"
        dump = getattr(request, "model_dump", None)
        body = dict(request) if dump is None else dump(mode="json", exclude_unset=True)
        body["operation"] = str(body.get("operation") or request.operation.value)
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
        self, stack: StackLike, page_size: int = 20, page_token: str | None = None
    ) -> RunPage:
        params: dict[str, Any] = {"page_size": page_size}
        if page_token:
            params["page_token"] = page_token
        return self.model(
            RunPage, self.request("GET", f"{self.stack_path(stack)}/runs", params=params)
        )

    def get_run(self, stack: StackLike, run_id: str) -> RunView:
        return self.model(RunView, self.request("GET", f"{self.stack_path(stack)}/runs/{run_id}"))

    def preview(self, stack: StackLike, run_id: str) -> dict[str, Any]:
        """The run's preview (changes and summary), sensitive values masked."""
        data = self.request("GET", f"{self.stack_path(stack)}/runs/{run_id}/preview")
        if not isinstance(data, dict):
            raise ApiProtocolError("the preview is not an object")
        return data

    def step(
        self,
        stack: StackLike,
        run_id: str,
        action: str,
        comment: str | None = None,
        idempotency_key: str | None = None,
    ) -> StepResult:
        """``approve``, ``reject``, ``retry``, ``abort`` or ``cancel`` the run (applied once
        per ``idempotency_key``; a fresh one unless given)."""
        if action not in STEPS:
            raise ValueError(f"{action}: not a step ({', '.join(STEPS)})")
        key = idempotency_key or f"stackflow-client-{os.urandom(16).hex()}"
        data = self.request(
            "POST",
            f"{self.stack_path(stack)}/runs/{run_id}/{action}",
            json={"comment": comment},
            headers={"Idempotency-Key": key},
        )
        return self.model(StepResult, data)

    def approve(self, stack: StackLike, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "approve", comment)

    def reject(self, stack: StackLike, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "reject", comment)

    def retry(self, stack: StackLike, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "retry", comment)

    def abort(self, stack: StackLike, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "abort", comment)

    def cancel(self, stack: StackLike, run_id: str, comment: str | None = None) -> StepResult:
        return self.step(stack, run_id, "cancel", comment)

    def events(
        self, stack: StackLike, run_id: str, after: int = 0, wait: bool = True
    ) -> EventStream:
        """The run's event stream after ``after`` (see :class:`EventStream`)."""
        return EventStream(self, stack, run_id, after, wait)

    def set_events(
        self, name: str, run_id: str = "latest", after: int = 0, wait: bool = True
    ) -> EventStream:
        """A set run's one stream: every member run's events, each naming its ``stack`` and
        ``run_id`` (a member run's end is ``stack_complete``)."""
        path = f"/v1/sets/{quote(name, safe='')}/runs/{quote(run_id, safe='')}/events"
        return EventStream(self, Stack("@set", name), run_id, after, wait, path)

    # ---- releases ------------------------------------------------------------------------
    def releases(self, stack: StackLike) -> list[dict[str, Any]]:
        """The stack's releases, newest first, without spec and state."""
        data = self.request("GET", f"{self.stack_path(stack)}/releases")
        if not isinstance(data, list):
            raise ApiProtocolError("the release list is not a list")
        return data

    def release(self, stack: StackLike, revision: int) -> dict[str, Any]:
        """One release with its spec and state, sensitive values masked."""
        return self._object(f"{self.stack_path(stack)}/releases/{revision}")

    def release_diff(self, stack: StackLike, old: int, new: int) -> dict[str, Any]:
        return self._object(f"{self.stack_path(stack)}/releases/{old}/diff/{new}")

    def outputs(self, stack: StackLike) -> dict[str, Any]:
        return self._object(f"{self.stack_path(stack)}/outputs")

    def unlock(self, stack: StackLike, force: bool = False) -> dict[str, Any]:
        """Free a stack whose run ended without releasing it (ApiStackLocked while that run
        is open, unless ``force``): ``{revision, phase, holder, …}``. Needs the approver
        role."""
        return self._object(f"{self.stack_path(stack)}/unlock", "POST", {"force": force})

    def import_releases(self, project: str, request: Any) -> dict[str, Any]:
        """Import releases (``{"releases": [...]}``) into the project's stacks, which must have
        none (ApiConflict otherwise; nothing is written). Needs the approver role."""
        path = f"/v1/projects/{project}/releases/import"
        return self._object(path, "POST", _json_of(request))

    def export_releases(self, project: str, workspace: str | None = None) -> dict[str, Any]:
        """The project's stacks' releases (or one workspace's) in Kusion's file form, masked."""
        params = {"workspace": workspace} if workspace else None
        return self._object(f"/v1/projects/{project}/releases/export", params=params)

    # ---- drift ---------------------------------------------------------------------------
    def schedule_drift(self, stack: StackLike, request: Any) -> dict[str, Any]:
        """Check the stack for drift on a schedule (``{every, repair, auto_approve}``),
        replacing its schedule if it has one."""
        path = f"{self.stack_path(stack)}/drift/schedule"
        return self._object(path, "PUT", _json_of(request))

    def unschedule_drift(self, stack: StackLike) -> None:
        """Delete the stack's drift schedule (ApiNotFound when it has none)."""
        self.request("DELETE", f"{self.stack_path(stack)}/drift/schedule")

    def drift_status(self, stack: StackLike) -> dict[str, Any]:
        """The stack's last drift report and its drifted resources' masked diffs (ApiNotFound
        before its first check)."""
        return self._object(f"{self.stack_path(stack)}/drift")

    # ---- git sources and notification destinations -----------------------------------------
    def set_source(self, target: StackLike | str, source: Any) -> SourceView:
        """Bind the stack (or the set ``target`` names) to a git source (replacing its
        binding); the answer has no secret. Needs the approver role (of every project, for a
        set)."""
        data = self.request("PUT", self._source_path(target), json=_json_of(source))
        return self.model(SourceView, data)

    def source(self, target: StackLike | str) -> SourceView:
        """The stack's (or the named set's) git source (ApiNotFound when it has none)."""
        return self.model(SourceView, self.request("GET", self._source_path(target)))

    def unset_source(self, target: StackLike | str) -> None:
        """Unbind the stack (or the named set) from its git source (ApiNotFound: none)."""
        self.request("DELETE", self._source_path(target))

    def _source_path(self, target: StackLike | str) -> str:
        if isinstance(target, str):  # a set's name
            return f"/v1/sets/{quote(target, safe='')}/source"
        return f"{self.stack_path(target)}/source"

    def set_notification(self, project: str, name: str, destination: Any) -> NotificationTargetView:
        """Add the project's destination ``name``, or replace the one of that name; the
        answer has no secret. Needs the approver role."""
        data = self.request(
            "PUT",
            f"/v1/projects/{project}/notifications/{name}",
            json=_json_of(destination),
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
    def push_policy(self, project: str, bundle: Any) -> PolicyView:
        """Store the project's policy bundle (every later run evaluates it). Needs the
        approver role."""
        data = self.request("PUT", f"/v1/projects/{project}/policy", json=_json_of(bundle))
        return self.model(PolicyView, data)

    def policy(self, project: str) -> PolicyView:
        """The project's policy bundle (ApiNotFound when it has none)."""
        return self.model(PolicyView, self.request("GET", f"/v1/projects/{project}/policy"))

    def healthz(self) -> dict[str, Any]:
        return self._object("/v1/healthz")

    def _object(
        self,
        path: str,
        method: str = "GET",
        body: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        data = self.request(method, path, json=body, params=params)
        if not isinstance(data, dict):
            raise ApiProtocolError(f"{method} {path}: the answer is not an object")
        return data
