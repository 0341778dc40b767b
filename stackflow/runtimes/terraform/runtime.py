"""The Terraform runtime: one working directory per resource, state kept by stackflow.

- ``read``: ``apply -refresh-only`` against the seeded state, then the state's values
  (None when the state tracks nothing, or the refresh finds the object gone).
- ``preview``: ``plan -out`` + ``show -json``; never an apply. The planned values are the
  would-be object, values unknown until apply read ``(known after apply)``, a planned
  replacement sets ``replace``, sensitive values become ``sensitive_paths``.
- ``apply``: ``apply -auto-approve`` (of the plan an apply's preview kept for the same
  batch, when there is one: :mod:`.saved_plans`); returns the resource's attribute values
  at top level (so ``$kusion_path.<id>.result`` resolves) plus the Terraform state under
  :data:`STATE_KEY` and the sensitive paths under :data:`SENSITIVE_KEY`.
- ``delete``: ``destroy`` of what the seeded state tracks; nothing tracked is success. A
  delete's preview reads with a refresh; the delete of the same batch then destroys from the
  state that refresh wrote without refreshing again (``-refresh=false``, :mod:`.saved_plans`).

Every command first seeds ``terraform.tfstate`` from the state stackflow recorded, so a
fresh worker (or another machine) can read, change or destroy what an earlier one created.
``init`` runs only when the provider requirements changed (a stamp in the working
directory), under a lock per provider (OpenTofu 1.8's plugin cache is not safe for
concurrent installs); everything else for independent resources runs in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from python_terraform import IsFlagged

from stackflow.core.config import stackflow_home
from stackflow.core.refs import StackRef
from stackflow.runtimes.base import (
    Attributes,
    Conflict,
    NotFound,
    PreviewResult,
    ResourceRequest,
    Runtime,
    RuntimeFailure,
    RuntimeOptions,
)
from stackflow.runtimes.faults import fault_point
from stackflow.runtimes.policy import WorkerPolicy, worker_policy
from stackflow.runtimes.terraform.batch import (
    BATCH_FILES,
    SPLIT_ABOVE,
    Call,
    Coalescer,
    StateLoader,
    Verb,
    batch_dir,
    batch_key,
    merge_states,
    salvage,
    salvage_all,
    split_states,
    write_members,
)
from stackflow.runtimes.terraform.cli import Cli, failure, resource_locks
from stackflow.runtimes.terraform.config import (
    TerraformResource,
    parse_resource,
    render_module,
)
from stackflow.runtimes.terraform.policy import check_terraform, terraform_env
from stackflow.runtimes.terraform.rules import TYPE_NAME
from stackflow.runtimes.terraform.saved_plans import (
    inputs_digest,
    keep_plan,
    keep_refreshed,
    take_plan,
    take_refreshed,
)
from stackflow.runtimes.terraform.state import (
    RESERVED_KEYS,
    SENSITIVE_KEY,
    STATE_KEY,
    State,
    choose_state,
    compact,
    instance,
    newest,
    recorded_state,
    resource_change,
)
from stackflow.runtimes.terraform.workdir import (
    BATCH_TIMEOUT_SECONDS,
    CONFIG_FILE,
    LOCK_TIMEOUT,
    PLAN_FILE,
    STATE_FILE,
    TOFU_PARALLELISM,
    VARS_FILE,
    Workdir,
    batch_previews,
    preview_result,
    read_json,
    resource_workdir,
    safe_name,
    terraform_root,
    write_atomically,
    write_variables,
)
from stackflow.state.protocols import TerraformStateStore


class TerraformRuntime(Runtime):
    """Resources of type ``Terraform`` (Kusion's form), driven through the Terraform CLI."""

    type_name = TYPE_NAME
    coalesces_calls = True
    checks_every_call = True  # each call starts with _check (in _join or _workdir)

    def __init__(
        self,
        root: Path | None = None,
        binary: str | None = None,
        backend: TerraformStateStore | None = None,
        policy: WorkerPolicy | None = None,
    ) -> None:
        self._root = root
        self._policy = policy
        self.backend = backend
        self.cli = Cli(binary)
        self.schemas: dict[str, dict[str, Any]] = {}
        self._import_plans: dict[Path, tuple[str, dict[str, Any]]] = {}
        self._coalescer = Coalescer(self._run_batch)
        self._states = StateLoader(self._kept_states)
        self._salvaged: asyncio.Future[None] | None = None
        """What killed batches left on this host, split back once, before the first batch."""

    @property
    def policy(self) -> WorkerPolicy:
        return self._policy if self._policy is not None else worker_policy()

    def check_policy(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        self._check(parse_resource(resource), options)

    def _check(self, res: TerraformResource, options: RuntimeOptions) -> None:
        policy = self.policy.for_project(options.project, res.id)
        check_terraform(
            policy,
            res.id,
            provider_source=res.provider.source,
            provider_name=res.provider.local_name,
            resource_type=res.resource_type,
            arguments=res.arguments,
            provider_meta=res.provider_meta,
        )
        terraform_env(policy, res.id, options.context.get("env"))

    def root(self) -> Path:
        return self._root if self._root is not None else terraform_root(stackflow_home())

    def workdir_path(self, resource_id: str, options: RuntimeOptions) -> Path:
        return resource_workdir(self.root(), options.project, options.workspace, resource_id)

    @contextlib.asynccontextmanager
    async def _workdir(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> AsyncIterator[Workdir]:
        res = parse_resource(resource)
        self._check(res, options)  # the worker policy, before anything is written or run
        path = self.workdir_path(resource.id, options)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        # one command sequence per resource at a time, across processes
        async with resource_locks(path.parent, [resource.id]):
            try:
                yield Workdir(self, res, path, options)
            except RuntimeFailure as exc:  # e.g. no CLI, a timeout: name the resource
                if exc.resource_id is not None:
                    raise
                raise type(exc)(f"{resource.id}: {exc}", resource_id=resource.id) from None
            finally:
                if self.backend is not None:
                    # The backend keeps the state (sealed): nothing that holds values (state,
                    # plan, the rendered config) stays on this host's disk between commands.
                    for name in (
                        STATE_FILE,
                        f"{STATE_FILE}.backup",
                        PLAN_FILE,
                        CONFIG_FILE,
                        VARS_FILE,
                    ):
                        (path / name).unlink(missing_ok=True)

    # ---- read -------------------------------------------------------------------------------
    async def _read(
        self, resource: ResourceRequest, options: RuntimeOptions, *, keep_state: bool
    ) -> Attributes | None:
        async with self._workdir(resource, options) as wd:
            state = wd.seed(resource.prior_state, await self._stored(resource.id, options))
            if instance(state) is None:
                if wd.res.import_id:
                    return await self._read_importable(wd)
                return None
            await wd.ensure_init()
            wd.write_config(with_resource=False)
            result = await wd.run(
                "apply",
                refresh_only=IsFlagged,
                auto_approve=IsFlagged,
                input=False,
                json=IsFlagged,
                lock_timeout=LOCK_TIMEOUT,
            )
            if result.code != 0:
                raise failure(resource.id, "terraform refresh", result, config_stage=False)
            state = wd.local_state()
            found = await wd.values(state) if state else None
            if found is None:
                return None
            values, sensitive = found
            if keep_state:
                assert state is not None
                values[STATE_KEY] = compact(state)
                values[SENSITIVE_KEY] = sensitive
            return values

    async def _read_importable(self, wd: Workdir) -> Attributes | None:
        """The object an import id names, as the provider reads it (None if it is absent)."""
        await wd.ensure_init()
        wd.write_config(with_resource=True, import_existing=True)
        plan = await wd.plan()
        # preview reuses this plan: a second import would read the object again, and
        # providers that derive values on import (random_password's bcrypt_hash) differ
        self._import_plans[wd.path] = ((wd.path / CONFIG_FILE).read_text(), plan)
        change = resource_change(plan, wd.res.address) or {}
        before = (change.get("change") or {}).get("before")
        return dict(before) if isinstance(before, dict) else None

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        live = await self._refreshed(resource, options)
        return None if live is None else strip_reserved(live)

    async def wait_ready(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        live = await self._refreshed(resource, options)
        if live is None:
            raise NotFound(f"{resource.id} does not exist", resource_id=resource.id)
        return live

    async def _refreshed(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> Attributes | None:
        """The live values with the state kept (None: gone or never created)."""
        call = await self._join("read", resource, options)
        if call is None:
            return await self._read(resource, options, keep_state=True)
        if instance(call.state) is None:
            return None
        found: Attributes | None = await self._coalescer.submit(call.key, call)
        return found

    # ---- preview ----------------------------------------------------------------------------
    async def preview(self, resource: ResourceRequest, options: RuntimeOptions) -> PreviewResult:
        call = await self._join("preview", resource, options)
        if call is None:
            return await self._preview_one(resource, options)
        result: PreviewResult = await self._coalescer.submit(call.key, call)
        return result

    async def observe(
        self, resource: ResourceRequest, options: RuntimeOptions, *, with_preview: bool
    ) -> tuple[Attributes | None, PreviewResult | None]:
        """With the preview: one plan answers both (it refreshes the state it starts from)."""
        call = await self._join("observe", resource, options) if with_preview else None
        if call is None:
            return await super().observe(resource, options, with_preview=with_preview)
        found: tuple[Attributes | None, PreviewResult] = await self._coalescer.submit(
            call.key, call
        )
        return found

    async def _preview_one(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> PreviewResult:
        async with self._workdir(resource, options) as wd:
            state = wd.seed(resource.prior_state, await self._stored(resource.id, options))
            await wd.ensure_init()
            importing = instance(state) is None and wd.res.import_id is not None
            wd.write_config(with_resource=True, import_existing=importing)
            cached = self._import_plans.pop(wd.path, None)
            if importing and cached and cached[0] == (wd.path / CONFIG_FILE).read_text():
                plan = cached[1]
            elif await wd.plan_file() and (held := await wd.held(state)) is not None:
                return held[1]  # nothing changes: the state says it all
            else:
                plan = await wd.show()
            block = await wd.schema() if not wd.res.provider.builtin else None
        return preview_result(wd.res, resource_change(plan, wd.res.address), block)

    # ---- apply ------------------------------------------------------------------------------
    async def _stored(self, resource_id: str, options: RuntimeOptions) -> State | None:
        """The state the backend kept for the resource after its last command."""
        if self.backend is None:
            return None
        body = await self._states.get(options.stack, resource_id)
        return json.loads(body) if body else None

    def _kept_states(self, stack: StackRef, ids: list[str]) -> Mapping[str, str]:
        assert self.backend is not None
        return self.backend.get_terraform_states(stack, ids)

    async def _keep(self, wd: Workdir, options: RuntimeOptions) -> None:
        """Right after a command that may change the state: the backend keeps it (fenced by
        the run), so a retry on any host resumes from it instead of creating twice."""
        await self._keep_state(wd.res.id, wd.local_state(), options)

    async def _keep_state(
        self, resource_id: str, state: State | None, options: RuntimeOptions
    ) -> None:
        if self.backend is None or options.revision is None or state is None:
            return
        run = options.owner
        await asyncio.to_thread(
            self.backend.put_terraform_state,
            options.stack,
            resource_id,
            json.dumps(state, separators=(",", ":")),
            revision=options.revision,
            run=run,
        )

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        call = await self._join("apply", resource, options)
        if call is None:
            return await self._apply_one(resource, options)
        live: Attributes = await self._coalescer.submit(call.key, call)
        return live

    async def _apply_one(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        async with self._workdir(resource, options) as wd:
            state = wd.seed(resource.prior_state, await self._stored(resource.id, options))
            await wd.ensure_init()
            wd.write_config(with_resource=True, import_existing=instance(state) is None)
            result = await wd.run(
                "apply",
                auto_approve=IsFlagged,
                input=False,
                json=IsFlagged,
                lock_timeout=LOCK_TIMEOUT,
            )
            await self._keep(wd, options)
            fault_point("after-tofu-apply", resource.id)
            if result.code != 0:
                raise failure(resource.id, "terraform apply", result, config_stage=False)
            state = wd.local_state()
            found = await wd.values(state) if state else None
            if found is None or state is None:
                raise Conflict(
                    f"{resource.id}: terraform apply succeeded but the state tracks no "
                    f"{wd.res.address}",
                    resource_id=resource.id,
                )
            values, sensitive = found
            values[STATE_KEY] = compact(state)
            values[SENSITIVE_KEY] = sensitive
            return values

    # ---- delete -----------------------------------------------------------------------------
    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        call = await self._join("delete", resource, options)
        if call is None:
            await self._delete_one(resource, options)
        elif instance(call.state) is not None:
            await self._coalescer.submit(call.key, call)

    async def _delete_one(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        prior = resource.prior_state if resource.prior_state is not None else resource.attributes
        async with self._workdir(resource, options) as wd:
            state = wd.seed(prior, await self._stored(resource.id, options))
            if instance(state) is None:
                return
            await wd.ensure_init()
            wd.write_config(with_resource=False)
            result = await wd.run(
                "destroy",
                auto_approve=IsFlagged,
                input=False,
                json=IsFlagged,
                lock_timeout=LOCK_TIMEOUT,
            )
            await self._keep(wd, options)
            if result.code != 0:
                raise failure(resource.id, "terraform destroy", result, config_stage=False)

    # ---- batches: concurrent calls of one provider configuration, one command --------------
    async def _join(
        self, verb: Verb, resource: ResourceRequest, options: RuntimeOptions
    ) -> Call | None:
        """The call as a batch member, its state chosen; None: it runs on its own (no state
        backend to keep each member's state in, or an import, which plans apart)."""
        if self.backend is None:
            return None
        res = parse_resource(resource)
        if res.import_id:
            return None
        self._check(res, options)  # the worker policy, before anything is written or run
        if self._salvaged is None:
            self._salvaged = asyncio.ensure_future(asyncio.to_thread(salvage_all, self.root()))
        try:
            await asyncio.shield(self._salvaged)  # every first call waits: they batch together
        except Exception:
            self._salvaged = None  # tried again by the next call
            raise
        stored = await self._stored(resource.id, options)
        prior = resource.prior_state
        deleting = verb == "delete" and prior is None
        recorded = recorded_state(resource.attributes if deleting else prior)
        call = Call(verb, resource, options, res, None, stored=stored, recorded=recorded)
        call.key = batch_key(res, options)
        if verb in ("read", "delete"):
            self._choose(call)  # whether there is anything to read or delete: asked at once
        return call

    def _choose(self, call: Call) -> None:
        """The state the call acts on: as :meth:`Workdir.seed` chooses it. A batch chooses
        again under its locks (a command of another process may have run meanwhile)."""
        local = read_json(self.workdir_path(call.res.id, call.options) / STATE_FILE)
        call.local = local is not None
        call.state = choose_state(call.recorded, newest(call.stored, local))

    async def _run_batch(self, calls: list[Call]) -> None:
        if len(calls) > 1:
            try:
                done = await self._batch_command(calls)
            except RuntimeFailure:
                done = False  # each member on its own says what is wrong with it
            if done:
                return
            left = [c for c in calls if not c.settled]
            if len(left) > SPLIT_ABOVE:  # halves find a bad member in a few commands
                kept = await asyncio.gather(*(self._stored(c.res.id, c.options) for c in left))
                for call, stored in zip(left, kept, strict=True):
                    call.stored = stored  # what the failed command applied and kept
                half = len(left) // 2
                await asyncio.gather(self._run_batch(left[:half]), self._run_batch(left[half:]))
                return
        gate = asyncio.Semaphore(4)

        async def alone(call: Call) -> None:
            async with gate:
                try:
                    call.settle(await self._single(call))
                except Exception as exc:
                    call.settle(error=exc)

        await asyncio.gather(*(alone(c) for c in calls if not c.settled))

    async def _single(self, call: Call) -> Any:
        if call.verb == "read":
            return await self._read(call.request, call.options, keep_state=True)
        if call.verb == "preview":
            return await self._preview_one(call.request, call.options)
        if call.verb == "observe":  # alone: no second try at a batch
            live = await self._read(call.request, call.options, keep_state=True)
            preview = await self._preview_one(call.request, call.options)
            return (None if live is None else strip_reserved(live)), preview
        if call.verb == "apply":
            return await self._apply_one(call.request, call.options)
        await self._delete_one(call.request, call.options)
        return None

    async def _batch_command(self, calls: list[Call]) -> bool:
        """One command for every call; False: it failed, each member runs on its own."""
        calls = sorted(calls, key=lambda c: c.res.address)  # the same files for the same calls
        first = calls[0]
        options = first.options
        base = self.root() / safe_name(options.project) / safe_name(options.workspace)
        # (a member's own working directory is made only when something is put there)
        workdirs = {c.res.id: self.workdir_path(c.res.id, c.options) for c in calls}
        async with (
            batch_dir(base, first.key) as path,
            resource_locks(base, [c.res.id for c in calls]),
        ):
            salvage(path)
            for call in calls:
                self._choose(call)
            # tofu runs 10 resources at a time: the batch gets each round's time
            rounds = -(-len(calls) // TOFU_PARALLELISM)
            timeout = min(options.timeout_seconds * rounds, BATCH_TIMEOUT_SECONDS)
            wd = Workdir(
                self, first.res, path, options.model_copy(update={"timeout_seconds": timeout})
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
                done = await self._batch_verb(wd, calls)
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

    async def _batch_verb(self, wd: Workdir, calls: list[Call]) -> bool:
        verb, options, backend = calls[0].verb, calls[0].options, self.backend
        if verb in ("preview", "observe"):
            members = [Workdir(self, call.res, wd.path, call.options) for call in calls]
            previews = await batch_previews(wd, members)
            if verb == "observe" and backend is not None:
                await keep_plan(backend, options, wd.path, self.cli.binary)
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
            planned = await take_plan(backend, options, wd.path, self.cli.binary)
        if verb == "delete" and backend is not None:
            refreshed = await take_refreshed(backend, options, wd.path, self.cli.binary)
        if refreshed:  # destroyed from the state its preview's refresh wrote, not refreshed again
            flags["refresh"] = False
        keeping = verb == "read" and backend is not None and options.preview_of is not None
        read_from = inputs_digest(wd.path, self.cli.binary) if keeping else None
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
        if verb != "read" and merged is not None and self.backend is not None:
            # kept (all in one transaction) before anything else: a retry on any host resumes
            # from each member's state
            if options.revision is not None:
                owner = options.owner
                await asyncio.to_thread(
                    self.backend.put_terraform_states,
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
            member = Workdir(self, call.res, wd.path, call.options)
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


def strip_reserved(attributes: Mapping[str, Any]) -> Attributes:
    """The attributes without stackflow's reserved keys (state and sensitive paths)."""
    return {k: v for k, v in attributes.items() if k not in RESERVED_KEYS}
