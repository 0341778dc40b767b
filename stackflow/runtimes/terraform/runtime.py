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
from stackflow.runtimes.policy import WorkerPolicy
from stackflow.runtimes.terraform.batch import Call
from stackflow.runtimes.terraform.batching import Batches
from stackflow.runtimes.terraform.cli import Cli, failure, resource_locks
from stackflow.runtimes.terraform.config import parse_resource
from stackflow.runtimes.terraform.host import Host
from stackflow.runtimes.terraform.rules import TYPE_NAME
from stackflow.runtimes.terraform.state import (
    RESERVED_KEYS,
    SENSITIVE_KEY,
    STATE_KEY,
    State,
    compact,
    instance,
    resource_change,
)
from stackflow.runtimes.terraform.workdir import (
    CONFIG_FILE,
    LOCK_TIMEOUT,
    PLAN_FILE,
    STATE_FILE,
    VARS_FILE,
    Toolchain,
    Workdir,
    preview_result,
)
from stackflow.state.protocols import TerraformStateStore


class TerraformRuntime(Runtime):
    """Resources of type ``Terraform`` (Kusion's form), driven through the Terraform CLI."""

    type_name = TYPE_NAME
    coalesces_calls = True
    checks_every_call = True  # each call starts with host.check (in batches.join or _workdir)

    def __init__(
        self,
        root: Path | None = None,
        binary: str | None = None,
        backend: TerraformStateStore | None = None,
        policy: WorkerPolicy | None = None,
    ) -> None:
        self.tools = Toolchain(Cli(binary), policy)
        """The OpenTofu CLI, the worker policy, the providers' schemas."""
        self.host = Host(root, self.tools, backend)
        """Where working directories live, the policy check, the states the backend kept."""
        self.batches = Batches(self.host, self._single)
        """Concurrent calls of one provider configuration, run as one command."""
        self._import_plans: dict[Path, tuple[str, dict[str, Any]]] = {}

    @property
    def policy(self) -> WorkerPolicy:
        return self.tools.policy

    def check_policy(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        self.host.check(parse_resource(resource), options)

    @contextlib.asynccontextmanager
    async def _workdir(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> AsyncIterator[Workdir]:
        res = parse_resource(resource)
        self.host.check(res, options)  # the worker policy, before anything is written or run
        path = self.host.workdir_path(resource.id, options)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        # one command sequence per resource at a time, across processes
        async with resource_locks(path.parent, [resource.id]):
            try:
                yield Workdir(self.tools, res, path, options)
            except RuntimeFailure as exc:  # e.g. no CLI, a timeout: name the resource
                if exc.resource_id is not None:
                    raise
                raise type(exc)(f"{resource.id}: {exc}", resource_id=resource.id) from None
            finally:
                if self.host.backend is not None:
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
            state = wd.seed(resource.prior_state, await self.host.stored(resource.id, options))
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
        call = await self.batches.join("read", resource, options)
        if call is None:
            return await self._read(resource, options, keep_state=True)
        if instance(call.state) is None:
            return None
        found: Attributes | None = await self.batches.submit(call)
        return found

    # ---- preview ----------------------------------------------------------------------------
    async def preview(self, resource: ResourceRequest, options: RuntimeOptions) -> PreviewResult:
        call = await self.batches.join("preview", resource, options)
        if call is None:
            return await self._preview_one(resource, options)
        result: PreviewResult = await self.batches.submit(call)
        return result

    async def observe(
        self, resource: ResourceRequest, options: RuntimeOptions, *, with_preview: bool
    ) -> tuple[Attributes | None, PreviewResult | None]:
        """With the preview: one plan answers both (it refreshes the state it starts from)."""
        call = await self.batches.join("observe", resource, options) if with_preview else None
        if call is None:
            return await super().observe(resource, options, with_preview=with_preview)
        found: tuple[Attributes | None, PreviewResult] = await self.batches.submit(call)
        return found

    async def _preview_one(
        self, resource: ResourceRequest, options: RuntimeOptions
    ) -> PreviewResult:
        async with self._workdir(resource, options) as wd:
            state = wd.seed(resource.prior_state, await self.host.stored(resource.id, options))
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
    async def _keep(self, wd: Workdir, options: RuntimeOptions) -> None:
        """Right after a command that may change the state: the backend keeps it (fenced by
        the run), so a retry on any host resumes from it instead of creating twice."""
        await self._keep_state(wd.res.id, wd.local_state(), options)

    async def _keep_state(
        self, resource_id: str, state: State | None, options: RuntimeOptions
    ) -> None:
        backend = self.host.backend
        if backend is None or options.revision is None or state is None:
            return
        run = options.owner
        await asyncio.to_thread(
            backend.put_terraform_state,
            options.stack,
            resource_id,
            json.dumps(state, separators=(",", ":")),
            revision=options.revision,
            run=run,
        )

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        call = await self.batches.join("apply", resource, options)
        if call is None:
            return await self._apply_one(resource, options)
        live: Attributes = await self.batches.submit(call)
        return live

    async def _apply_one(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        async with self._workdir(resource, options) as wd:
            state = wd.seed(resource.prior_state, await self.host.stored(resource.id, options))
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

    # ---- delete -----------------------------------------------------------------------------
    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        call = await self.batches.join("delete", resource, options)
        if call is None:
            await self._delete_one(resource, options)
        elif instance(call.state) is not None:
            await self.batches.submit(call)

    async def _delete_one(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        prior = resource.prior_state if resource.prior_state is not None else resource.attributes
        async with self._workdir(resource, options) as wd:
            state = wd.seed(prior, await self.host.stored(resource.id, options))
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


def strip_reserved(attributes: Mapping[str, Any]) -> Attributes:
    """The attributes without stackflow's reserved keys (state and sensitive paths)."""
    return {k: v for k, v in attributes.items() if k not in RESERVED_KEYS}
