"""Concurrent calls whose resources can share a root module, run as one ``tofu`` command.

Each resource keeps its own state, lineage and serial (recorded per resource, as ever); only
the command is shared. Calls of one verb (refresh, plan, apply, destroy) for resources of one
stack, one provider configuration and one ``context.env`` that arrive together join one
batch (at most :data:`BATCH_LIMIT`): it stays open while calls keep coming, each within
:data:`QUIET_SECONDS` of the one before, for :data:`WINDOW_SECONDS` at most. The batch
merges their states into one, writes one configuration holding every resource block, runs
one command, and splits the resulting state back by resource address.

A batch of one runs the resource's own working directory as before. When a batch command
fails, every member falls back to that path on its own: members already applied apply again
as no-ops (their state was kept first), and each failure names its own resource.

A worker killed during a batch command leaves the merged state in the batch directory; the
next batch there (or the runtime's start on that host) splits it back into each member's own
working directory, where the member's next command finds it, exactly as a single command's
leftover state is found.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stackflow.core.refs import StackRef
from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.terraform.config import TerraformResource
from stackflow.runtimes.terraform.state import State, managed_by_address, newest
from stackflow.runtimes.terraform.workdir import (
    CONFIG_FILE,
    PLAN_FILE,
    STATE_FILE,
    VARS_FILE,
    read_json,
    write_atomically,
)

Verb = Literal["read", "preview", "observe", "apply", "delete"]

WINDOW_SECONDS = 0.05
"""How long a batch stays open for more calls after its first one, at most."""
QUIET_SECONDS = 0.005
"""A batch starts when no call joined it for this long: the calls of one activity arrive in
one loop turn (their states are read together), so waiting the whole window only delayed
every command (by about 0.1 s per 50-resource apply, preview included)."""
BATCH_LIMIT = 256
"""Resources per command at most (a full batch starts at once): a whole Terraform group of the
walk (``TERRAFORM_GROUP_LIMIT``) or a preview batch's Terraform resources, in one command."""
SPLIT_ABOVE = 8
"""A failed batch command of more members than this is tried again as two halves (what the
failed one applied is kept: they apply the rest); a smaller one runs each member on its own,
whose error then names its own resource."""
SLOTS = 4
"""Batch directories per stack and provider configuration (batches running side by side)."""
LOCK_NAME = ".stackflow.lock"
MEMBERS_FILE = "members.json"
"""In a batch directory during a command: each member's id, lineage and serial before it."""
BATCH_FILES = (STATE_FILE, f"{STATE_FILE}.backup", PLAN_FILE, CONFIG_FILE, VARS_FILE, MEMBERS_FILE)
"""What a batch command leaves in its directory, removed after it (values among them)."""


@dataclass
class Call:
    """One runtime call waiting in a batch."""

    verb: Verb
    request: ResourceRequest
    options: RuntimeOptions
    res: TerraformResource
    state: State | None
    """The state to act on (chosen from the release's, the backend's and the local cache)."""
    stored: State | None = None
    """The state the backend kept after the resource's last command."""
    recorded: State | None = None
    """The Terraform state the release recorded for the resource (parsed once)."""
    local: bool = False
    """Whether the resource's own working directory held a state when last chosen."""
    key: str = ""
    """Which batch it may join (:func:`batch_key`)."""
    future: asyncio.Future[Any] | None = None
    """Set when the call joins a batch; its caller waits on it."""

    @property
    def settled(self) -> bool:
        return self.future is None or self.future.done()

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.future is None or self.future.done():  # its caller gave up: nobody to tell
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


def batch_key(res: TerraformResource, options: RuntimeOptions) -> str:
    """Calls that may share a command: one stack, provider configuration, env and timeout."""
    doc = [
        options.project,
        options.workspace,
        options.revision,
        options.owner.model_dump(mode="json") if options.owner else None,
        options.force,
        options.timeout_seconds,
        res.provider.source,
        res.provider.version,
        res.provider.local_name,
        res.provider_meta,
        options.context.get("env"),
    ]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Coalescer:
    """Collects concurrent calls into batches and hands each full or timed-out batch over."""

    def __init__(
        self,
        run: Callable[[list[Call]], Awaitable[None]],
        *,
        window: float = WINDOW_SECONDS,
        quiet: float = QUIET_SECONDS,
    ) -> None:
        self._run = run
        self._window = window
        self._quiet = quiet
        self._open: dict[tuple[Verb, str], list[Call]] = {}
        self._addresses: dict[int, set[str]] = {}
        """The resource addresses in each open batch, by the batch's id."""
        self._tasks: dict[int, asyncio.Task[None]] = {}
        """Each batch's task, by the batch's id."""

    async def submit(self, key: str, call: Call) -> Any:
        call.future = asyncio.get_running_loop().create_future()
        slot = (call.verb, key)
        batch = self._open.get(slot)
        if batch is not None and call.res.address in self._addresses[id(batch)]:
            del self._open[slot]  # one address per root module: this call starts the next
            batch = None
        if batch is None:
            batch = self._open[slot] = []
            task = asyncio.get_running_loop().create_task(self._after_window(slot, batch))
            ident = id(batch)
            self._tasks[ident] = task
            self._addresses[ident] = set()
            task.add_done_callback(lambda _: self._tasks.pop(ident, None))
        batch.append(call)
        self._addresses[id(batch)].add(call.res.address)
        if len(batch) >= BATCH_LIMIT and self._open.get(slot) is batch:
            del self._open[slot]
        try:
            return await call.future
        except asyncio.CancelledError:
            # Every caller gave up (the run was cancelled, say): the command stops as a single
            # resource's does (tofu interrupted, then killed), and its state is salvaged.
            if all(c.future is not None and c.future.done() for c in batch):
                if self._open.get(slot) is batch:
                    del self._open[slot]
                self._addresses.pop(id(batch), None)  # (a task cancelled unstarted keeps it)
                running = self._tasks.get(id(batch))
                if running is not None:
                    running.cancel()
            raise

    async def _after_window(self, slot: tuple[Verb, str], batch: list[Call]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._window
        try:
            while self._open.get(slot) is batch:  # else full: it starts at once
                joined = len(batch)
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.sleep(min(self._quiet, left))
                if len(batch) == joined:
                    break
        finally:
            if self._open.get(slot) is batch:
                del self._open[slot]
            self._addresses.pop(id(batch), None)  # closed: nothing joins it any more
        try:
            await self._run(batch)
        except BaseException as exc:
            for call in batch:
                call.settle(error=exc)
            if not isinstance(exc, Exception):
                raise
        for call in batch:  # a runner that forgot one must not leave its caller hanging
            call.settle(error=RuntimeError(f"{call.res.id}: batch ended without a result"))


class StateLoader:
    """Kept states looked up by concurrent calls, one backend read per stack and loop turn:
    the members of a batch (which all start in one turn) cost one query instead of one
    each, and reach the batch together instead of trickling in through the thread pool."""

    def __init__(self, fetch: Callable[[StackRef, list[str]], Mapping[str, str]]) -> None:
        self._fetch = fetch
        self._pending: dict[StackRef, dict[str, asyncio.Future[str | None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def get(self, stack: StackRef, resource_id: str) -> str | None:
        loop = asyncio.get_running_loop()
        pending = self._pending.get(stack)
        if pending is None:
            pending = self._pending[stack] = {}
            task = loop.create_task(self._load(stack, pending))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        future = pending.get(resource_id)
        if future is None:
            future = pending[resource_id] = loop.create_future()
        # a cancelled caller must not cancel the answer another caller of the id awaits
        return await asyncio.shield(future)

    async def _load(self, stack: StackRef, pending: dict[str, asyncio.Future[str | None]]) -> None:
        await asyncio.sleep(0)  # the other calls of this turn join
        if self._pending.get(stack) is pending:
            del self._pending[stack]
        ids = list(pending)
        try:
            found = await asyncio.to_thread(self._fetch, stack, ids)
        except Exception:
            # e.g. one state that does not open: each id alone, so only its own call fails
            for rid in ids:
                try:
                    one = await asyncio.to_thread(self._fetch, stack, [rid])
                except Exception as exc:
                    _answer(pending[rid], error=exc)
                else:
                    _answer(pending[rid], one.get(rid))
            return
        except BaseException as exc:
            for future in pending.values():
                _answer(future, error=exc)
            raise
        for rid, future in pending.items():
            _answer(future, found.get(rid))


def _answer(
    future: asyncio.Future[str | None], value: str | None = None, error: BaseException | None = None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


# ---- the merged state ------------------------------------------------------------------------
def merge_states(states: Iterable[State | None]) -> State | None:
    """One state holding every member's resources (None: nothing tracked). The same states
    merge to the same document, lineage included (it is made from theirs): an apply's plan
    then finds its preview's (:mod:`.saved_plans`)."""
    resources: list[Any] = []
    version = None
    members: list[Any] = []
    for state in states:
        if not state:
            continue
        version = version or state.get("terraform_version")
        resources.extend(state.get("resources") or [])
        members.append([state.get("lineage"), state.get("serial")])
    if not resources:
        return None
    seed = json.dumps(members, separators=(",", ":"), default=str)
    return {
        "version": 4,
        "terraform_version": version or "1.8.0",
        "serial": 1,
        "lineage": str(uuid.uuid5(uuid.NAMESPACE_URL, f"stackflow:merged:{seed}")),
        "outputs": {},
        "resources": resources,
        "check_results": None,
    }


def split_states(merged: State | None, members: Mapping[str, State | None]) -> dict[str, State]:
    """Each member's part of a merged state (``members``: each one's address and its state
    before), as the next serial of its own lineage; by address."""
    merged = merged or {}
    parts = managed_by_address(merged)
    return {
        address: {
            "version": 4,
            "terraform_version": merged.get("terraform_version")
            or (before or {}).get("terraform_version")
            or "1.8.0",
            "serial": int((before or {}).get("serial", 0)) + 1,
            "lineage": (before or {}).get("lineage") or str(uuid.uuid4()),
            "outputs": {},
            "resources": parts.get(address, []),
            "check_results": None,
        }
        for address, before in members.items()
    }


# ---- batch directories ------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def batch_dir(base: Path, key: str) -> AsyncIterator[Path]:
    """A free batch directory for ``key`` (one of :data:`SLOTS`), held until the block ends."""
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = -1
    chosen: Path | None = None
    for slot in range(SLOTS):
        path = base / f"_batch-{key}-{slot}"
        path.mkdir(exist_ok=True, mode=0o700)
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            fd = -1
            continue
        chosen = path
        break
    if chosen is None:  # every slot busy: wait for the first
        chosen = base / f"_batch-{key}-0"
        fd = os.open(chosen / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
    try:
        yield chosen
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def held(path: Path) -> Iterator[bool]:
    """The batch directory's lock if it is free right now (True), without waiting."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_members(path: Path, calls: Iterable[Call], workdirs: dict[str, Path]) -> None:
    doc = {
        c.res.address: {
            "id": c.res.id,
            "workdir": str(workdirs[c.res.id]),
            "lineage": (c.state or {}).get("lineage"),
            "serial": (c.state or {}).get("serial", 0),
        }
        for c in calls
    }
    (path / MEMBERS_FILE).write_text(json.dumps(doc), encoding="utf-8")


def leftovers(path: Path, state_file: str) -> list[tuple[Path, State]]:
    """A killed batch's merged state, split per member: (member working dir, its state)."""
    try:
        members = json.loads((path / MEMBERS_FILE).read_text(encoding="utf-8"))
        merged = json.loads((path / state_file).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return []
    kept = {
        address: member
        for address, member in members.items()
        if isinstance(member, dict) and member.get("workdir")
    }
    befores: dict[str, State | None] = {
        address: {"lineage": m["lineage"], "serial": m.get("serial") or 0}
        if m.get("lineage")
        else None
        for address, m in kept.items()
    }
    parts = split_states(merged, befores)
    return [
        (Path(kept[address]["workdir"]), part)
        for address, part in parts.items()
        if part["resources"]
    ]


def salvage(path: Path) -> None:
    """A killed batch's leftovers in ``path``: each member's part of the merged state put in
    its own working directory (unless that holds a newer one), then the batch's files gone."""
    for workdir, state in leftovers(path, STATE_FILE):
        workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        local = read_json(workdir / STATE_FILE)
        if newest(state, local) is state:
            write_atomically(workdir / STATE_FILE, json.dumps(state, indent=2))
    for name in BATCH_FILES:
        (path / name).unlink(missing_ok=True)


def salvage_all(root: Path) -> None:
    """What batches killed on this host left under ``root``."""
    for path in root.glob(f"*/*/_batch-*/{MEMBERS_FILE}"):
        with held(path.parent) as free:
            if free:  # else another process's batch is running there
                salvage(path.parent)
