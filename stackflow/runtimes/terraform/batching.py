"""Batches: concurrent calls of one provider configuration and stack, run as one OpenTofu
command in a batch directory (:mod:`.batch` keeps its parts: the calls, the coalescer that
gathers them, merging and splitting states, salvage). A batch that fails is split in halves
(a bad member is found in a few commands), then its members run alone, each saying what is
wrong with it. A class of its own beside the runtime's single-resource verbs: it needs of
the runtime only this worker's :class:`~.host.Host` and the verb run alone (``single``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from python_terraform import IsFlagged

from stackflow.runtimes.base import Conflict, ResourceRequest, RuntimeFailure, RuntimeOptions
from stackflow.runtimes.faults import fault_point
from stackflow.runtimes.terraform.batch import (
    BATCH_FILES,
    SPLIT_ABOVE,
    Call,
    Coalescer,
    Verb,
    batch_dir,
    batch_key,
    merge_states,
    salvage,
    salvage_all,
    split_states,
    write_members,
)
from stackflow.runtimes.terraform.cli import resource_locks
from stackflow.runtimes.terraform.config import parse_resource, render_module
from stackflow.runtimes.terraform.host import Host
from stackflow.runtimes.terraform.saved_plans import (
    inputs_digest,
    keep_plan,
    keep_refreshed,
    take_plan,
    take_refreshed,
)
from stackflow.runtimes.terraform.state import (
    SENSITIVE_KEY,
    STATE_KEY,
    choose_state,
    compact,
    newest,
    recorded_state,
)
from stackflow.runtimes.terraform.workdir import (
    BATCH_TIMEOUT_SECONDS,
    CONFIG_FILE,
    LOCK_TIMEOUT,
    PLAN_FILE,
    STATE_FILE,
    TOFU_PARALLELISM,
    Workdir,
    batch_previews,
    read_json,
    safe_name,
    write_atomically,
    write_variables,
)


class Batches:
    """The runtime's batches: a call joins one (:meth:`join`, :meth:`submit`); each batch
    runs as one command, or in halves, or its members alone."""

    def __init__(self, host: Host, single: Callable[[Call], Awaitable[Any]]) -> None:
        self.host = host
        self._single = single
        """The call run alone (the runtime's verb for one resource)."""
        self._coalescer = Coalescer(self._run)
        self._salvaged: asyncio.Future[None] | None = None
        """What killed batches left on this host, split back once, before the first batch."""

    async def submit(self, call: Call) -> Any:
        """The call's answer, once the batch it joined ran."""
        return await self._coalescer.submit(call.key, call)

    async def join(
        self, verb: Verb, resource: ResourceRequest, options: RuntimeOptions
    ) -> Call | None:
        """The call as a batch member, its state chosen; None: it runs on its own (no state
        backend to keep each member's state in, or an import, which plans apart)."""
        if self.host.backend is None:
            return None
        res = parse_resource(resource)
        if res.import_id:
            return None
        self.host.check(res, options)  # the worker policy, before anything is written or run
        if self._salvaged is None:
            self._salvaged = asyncio.ensure_future(asyncio.to_thread(salvage_all, self.host.root()))
        try:
            await asyncio.shield(self._salvaged)  # every first call waits: they batch together
        except Exception:
            self._salvaged = None  # tried again by the next call
            raise
        stored = await self.host.stored(resource.id, options)
        prior = resource.prior_state
        deleting = verb == "delete" and prior is None
        recorded = recorded_state(resource.attributes if deleting else prior)
        call = Call(verb, resource, options, res, None, stored=stored, recorded=recorded)
        call.key = batch_key(res, options)
        if verb in ("read", "delete"):
            self.choose(call)  # whether there is anything to read or delete: asked at once
        return call

    def choose(self, call: Call) -> None:
        """The state the call acts on: as :meth:`Workdir.seed` chooses it. A batch chooses
        again under its locks (a command of another process may have run meanwhile)."""
        local = read_json(self.host.workdir_path(call.res.id, call.options) / STATE_FILE)
        call.local = local is not None
        call.state = choose_state(call.recorded, newest(call.stored, local))

    async def _run(self, calls: list[Call]) -> None:
        if len(calls) > 1:
            try:
                done = await self.command(calls)
            except RuntimeFailure:
                done = False  # each member on its own says what is wrong with it
            if done:
                return
            left = [c for c in calls if not c.settled]
            if len(left) > SPLIT_ABOVE:  # halves find a bad member in a few commands
                kept = await asyncio.gather(*(self.host.stored(c.res.id, c.options) for c in left))
                for call, stored in zip(left, kept, strict=True):
                    call.stored = stored  # what the failed command applied and kept
                half = len(left) // 2
                await asyncio.gather(self._run(left[:half]), self._run(left[half:]))
                return
        gate = asyncio.Semaphore(4)

        async def alone(call: Call) -> None:
            async with gate:
                try:
                    call.settle(await self._single(call))
                except Exception as exc:
                    call.settle(error=exc)

        await asyncio.gather(*(alone(c) for c in calls if not c.settled))

    async def command(self, calls: list[Call]) -> bool:
        """One command for every call; False: it failed, each member runs on its own."""
        calls = sorted(calls, key=lambda c: c.res.address)  # the same files for the same calls
        first = calls[0]
        options = first.options
        base = self.host.root() / safe_name(options.project) / safe_name(options.workspace)
        # (a member's own working directory is made only when something is put there)
        workdirs = {c.res.id: self.host.workdir_path(c.res.id, c.options) for c in calls}
        async with (
            batch_dir(base, first.key) as path,
            resource_locks(base, [c.res.id for c in calls]),
        ):
            salvage(path)
            for call in calls:
                self.choose(call)
            # tofu runs 10 resources at a time: the batch gets each round's time
            rounds = -(-len(calls) // TOFU_PARALLELISM)
            timeout = min(options.timeout_seconds * rounds, BATCH_TIMEOUT_SECONDS)
            wd = Workdir(
                self.host.tools,
                first.res,
                path,
                options.model_copy(update={"timeout_seconds": timeout}),
            )
            try:
                await wd.ensure_init()
                merged = merge_states(c.state for c in calls)
                if merged is None:
                    (path / STATE_FILE).unlink(missing_ok=True)
                else:
                    write_atomically(path / STATE_FILE, json.dumps(merged))
                write_members(path, calls, workdirs)
                with_resources = first.verb in ("preview", "observe", "apply")
                members = [c.res for c in calls]
                doc = render_module(members, with_resources=with_resources)
                write_variables(path, members if with_resources else [])
                write_atomically(path / CONFIG_FILE, json.dumps(doc, indent=2, sort_keys=True))
                done = await self._verb(wd, calls)
                if done and first.verb in ("apply", "delete"):
                    for call in calls:  # superseded by what the batch kept
                        if call.local:
                            (workdirs[call.res.id] / STATE_FILE).unlink(missing_ok=True)
                return done
            except BaseException:
                # e.g. the backend failed to keep what tofu wrote: it stays where this host's
                # retry looks, each member's part in its own working directory
                salvage(path)
                raise
            finally:
                for name in BATCH_FILES:
                    (path / name).unlink(missing_ok=True)

    async def _verb(self, wd: Workdir, calls: list[Call]) -> bool:
        verb, options, backend = calls[0].verb, calls[0].options, self.host.backend
        if verb in ("preview", "observe"):
            members = [Workdir(self.host.tools, call.res, wd.path, call.options) for call in calls]
            previews = await batch_previews(wd, members)
            if verb == "observe" and backend is not None:
                await keep_plan(backend, options, wd.path, self.host.tools.cli.binary)
            for call, previewed in zip(calls, previews, strict=True):
                if isinstance(previewed, RuntimeFailure):
                    call.settle(error=previewed)
                else:
                    call.settle(previewed[1] if verb == "preview" else previewed)
            return True
        command = {"read": "apply", "apply": "apply", "delete": "destroy"}[verb]
        flags: dict[str, Any] = {"refresh_only": IsFlagged} if verb == "read" else {}
        planned = refreshed = False
        if verb == "apply" and backend is not None:
            planned = await take_plan(backend, options, wd.path, self.host.tools.cli.binary)
        if verb == "delete" and backend is not None:
            refreshed = await take_refreshed(backend, options, wd.path, self.host.tools.cli.binary)
        if refreshed:  # destroyed from the state its preview's refresh wrote, not refreshed again
            flags["refresh"] = False
        keeping = verb == "read" and backend is not None and options.preview_of is not None
        read_from = inputs_digest(wd.path, self.host.tools.cli.binary) if keeping else None
        result = await wd.run(
            command,
            *([PLAN_FILE] if planned else []),
            auto_approve=IsFlagged,
            input=False,
            json=IsFlagged,
            lock_timeout=LOCK_TIMEOUT,
            **flags,
        )
        if read_from is not None and result.code == 0 and backend is not None:
            await keep_refreshed(backend, options, read_from, wd.path)
        merged = wd.local_state()
        split = split_states(merged, {c.res.address: c.state for c in calls})
        parts = {c.res.id: split[c.res.address] for c in calls}
        if verb != "read" and merged is not None and self.host.backend is not None:
            # kept (all in one transaction) before anything else: a retry on any host resumes
            # from each member's state
            if options.revision is not None:
                owner = options.owner
                await asyncio.to_thread(
                    self.host.backend.put_terraform_states,
                    options.stack,
                    {rid: json.dumps(part, separators=(",", ":")) for rid, part in parts.items()},
                    revision=options.revision,
                    run=owner,
                )
            if verb == "apply":
                for call in calls:
                    fault_point("after-tofu-apply", call.res.id)
        if result.code != 0 or merged is None:
            return False
        for call in calls:
            if verb == "delete":
                call.settle(None)
                continue
            part = parts[call.res.id]
            member = Workdir(self.host.tools, call.res, wd.path, call.options)
            found = await member.values(part)
            if found is None:
                if verb == "read":
                    call.settle(None)
                else:
                    call.settle(
                        error=Conflict(
                            f"{call.res.id}: terraform apply succeeded but the state tracks no "
                            f"{call.res.address}",
                            resource_id=call.res.id,
                        )
                    )
                continue
            values, sensitive = found
            values[STATE_KEY] = compact(part)
            values[SENSITIVE_KEY] = sensitive
            call.settle(values)
        return True
