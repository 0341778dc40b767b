"""A Terraform resource's working directory on a worker (a cache: config, providers, state
seeded from the state backend) and the commands run in it; what a plan says as a preview."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from python_terraform import IsFlagged

from stackflow.core.paths import format_path
from stackflow.runtimes.base import (
    Attributes,
    PreviewResult,
    RuntimeFailure,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.terraform.cli import (
    GENERATED_CONFIG,
    Result,
    base_env,
    failure,
    file_locks,
    lock_dir,
)
from stackflow.runtimes.terraform.config import (
    TerraformResource,
    render_config,
    render_variables,
    required_providers,
)
from stackflow.runtimes.terraform.policy import terraform_env
from stackflow.runtimes.terraform.state import (
    BUILTIN_SCHEMAS,
    State,
    choose_state,
    decode_block,
    instance,
    managed_by_address,
    marked_paths,
    newest,
    planned_lives,
    recorded_state,
    resource_changes,
    schema_sensitive_paths,
    state_sensitive_paths,
    with_unknowns,
)

if TYPE_CHECKING:
    from stackflow.runtimes.terraform.runtime import TerraformRuntime

STATE_FILE = "terraform.tfstate"
CONFIG_FILE = GENERATED_CONFIG
PLAN_FILE = "stackflow.tfplan"
VARS_FILE = "stackflow.auto.tfvars.json"
"""The sensitive variables' values (OpenTofu loads ``*.auto.tfvars.json`` by itself)."""
INIT_STAMP = ".stackflow-init"
LOCK_TIMEOUT = "120s"
TOFU_PARALLELISM = 10
"""OpenTofu's default ``-parallelism``: resources one command works on at once."""
BATCH_TIMEOUT_SECONDS = 1500.0
"""A batch command's time at most (within the activity's 30-minute start-to-close)."""


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


@functools.lru_cache(maxsize=16)
def terraform_root(home: Path) -> Path:
    """Where the worker keeps Terraform working directories, under stackflow's home."""
    return home / "terraform"


@functools.lru_cache(maxsize=4096)
def resource_workdir(root: Path, project: str, workspace: str, resource_id: str) -> Path:
    """A resource's working directory (asked for several times per resource and call)."""
    digest = hashlib.sha256(resource_id.encode()).hexdigest()[:8]
    return root / safe_name(project) / safe_name(workspace) / f"{safe_name(resource_id)}-{digest}"


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".stackflow-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_variables(path: Path, members: list[TerraformResource]) -> None:
    """The members' sensitive variables next to their configuration (0600, removed after
    the command with the configuration); none: no file."""
    values = render_variables(members)
    if values:
        write_atomically(path / VARS_FILE, json.dumps(values))
    else:
        (path / VARS_FILE).unlink(missing_ok=True)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class Workdir:
    """A resource's working directory: a cache of config, providers and state."""

    def __init__(
        self, runtime: TerraformRuntime, res: TerraformResource, path: Path, options: RuntimeOptions
    ) -> None:
        self.runtime = runtime
        self.res = res
        self.path = path
        self.options = options

    @functools.cached_property
    def env(self) -> dict[str, str]:
        """The command's environment, made when a command first runs (a batch's members
        only read their part of the state): provider credentials from context.env (checked
        by the policy), passed, never written."""
        policy = self.runtime.policy.for_project(self.options.project, self.res.id)
        return base_env(terraform_env(policy, self.res.id, self.options.context.get("env")), policy)

    # ---- files ------------------------------------------------------------------------------
    def local_state(self) -> State | None:
        return read_json(self.path / STATE_FILE)

    def seed(self, prior: Mapping[str, Any] | None, stored: State | None = None) -> State | None:
        """Put the state to act on in place; returns it (None: nothing is tracked).

        ``stored`` is the state the backend kept after the last command on any host: a
        fresh working directory on another worker starts from it, not from nothing.
        """
        local = self.local_state()
        chosen = choose_state(recorded_state(prior), newest(stored, local))
        if chosen is None:
            if local is not None:
                (self.path / STATE_FILE).unlink(missing_ok=True)
            return None
        if chosen is not local:
            write_atomically(self.path / STATE_FILE, json.dumps(chosen, indent=2))
        return chosen

    def write_config(self, *, with_resource: bool, import_existing: bool = False) -> None:
        doc = render_config(self.res, with_resource=with_resource, import_existing=import_existing)
        write_variables(self.path, [self.res] if with_resource else [])
        text = json.dumps(doc, indent=2, sort_keys=True)
        path = self.path / CONFIG_FILE
        with contextlib.suppress(FileNotFoundError):
            if path.read_text(encoding="utf-8") == text:
                return
        write_atomically(path, text)

    # ---- commands ---------------------------------------------------------------------------
    async def run(self, command: str, *args: str, **flags: Any) -> Result:
        return await self.runtime.cli.run(
            self.path, command, *args, env=self.env, timeout=self.options.timeout_seconds, **flags
        )

    async def ensure_init(self) -> None:
        """``init`` when the provider requirements changed since the last one (stamp)."""
        providers = required_providers(self.res)
        stamp = hashlib.sha256(
            json.dumps([providers, self.runtime.cli.binary], sort_keys=True).encode()
        ).hexdigest()
        stamp_path = self.path / INIT_STAMP
        lockfile = self.path / ".terraform.lock.hcl"
        with contextlib.suppress(FileNotFoundError):
            if stamp_path.read_text() == stamp and (not providers or lockfile.exists()):
                return
        lockfile.unlink(missing_ok=True)
        shutil.rmtree(self.path / ".terraform", ignore_errors=True)
        if providers:
            # init needs a configuration naming the providers; the resource block is not needed
            self.write_config(with_resource=False)
            locks = lock_dir()
            template = locks / f"{self.res.provider.key}.terraform.lock.hcl"
            async with file_locks([locks / f"{self.res.provider.key}.lock"]):
                # With a dependency lock file naming the cached package, init only links the
                # shared cache; without one, OpenTofu 1.8 re-installs the package into the
                # cache, briefly removing it under the feet of every other working directory.
                if template.exists():
                    shutil.copyfile(template, lockfile)
                result = await self.run("init", input=False, no_color=IsFlagged, backend=False)
                if result.code != 0 and template.exists():
                    # the mirror's package changed since the template was taken: start over
                    template.unlink(missing_ok=True)
                    lockfile.unlink(missing_ok=True)
                    result = await self.run("init", input=False, no_color=IsFlagged, backend=False)
                if result.code == 0 and not template.exists():
                    write_atomically(template, lockfile.read_text())
            if result.code != 0:
                raise failure(self.res.id, "terraform init", result, config_stage=True)
        write_atomically(stamp_path, stamp)

    async def schema(self) -> dict[str, Any] | None:
        """The resource type's schema block (cached per provider and version)."""
        if self.res.provider.builtin:
            return BUILTIN_SCHEMAS.get(self.res.resource_type)
        key = f"{self.res.provider.source}@{self.res.provider.version}"
        schemas = self.runtime.schemas.get(key)
        if schemas is None:
            result = await self.run("providers schema", json=IsFlagged)
            schemas = {}
            if result.code == 0:
                with contextlib.suppress(ValueError):
                    doc = json.loads(result.out)
                    for provider in (doc.get("provider_schemas") or {}).values():
                        for rtype, spec in (provider.get("resource_schemas") or {}).items():
                            schemas[rtype] = spec.get("block") or {}
            self.runtime.schemas[key] = schemas
        return schemas.get(self.res.resource_type)

    async def values(self, state: State) -> tuple[Attributes, list[str]] | None:
        inst = instance(state, self.res.address) or instance(state)
        if inst is None:
            return None
        block = await self.schema()
        raw = inst.get("attributes") or {}
        values = decode_block(raw, block) if block else dict(raw)
        return values, state_sensitive_paths(inst, block)

    async def held(self, state: State | None) -> tuple[Attributes, PreviewResult] | None:
        """The resource as ``state`` holds it at its address (values and sensitive paths as
        show renders them), as its live object and its preview: what a plan that changes
        nothing and found no drift would show; None when ``state`` does not hold it."""
        if state is None or instance(state, self.res.address) is None:
            return None
        found = await self.values(state)
        if found is None:
            return None
        values, sensitive = found
        return values, PreviewResult(would_be=dict(values), sensitive_paths=sorted(sensitive))

    async def plan(self) -> dict[str, Any]:
        """``tofu plan`` to a plan file, then ``tofu show -json`` of it."""
        await self.plan_file()
        return await self.show()

    async def plan_file(self) -> bool:
        """``tofu plan`` to a plan file; whether its own messages say it changes nothing
        and its refresh found nothing changed (no drift): the state then holds what
        ``tofu show -json`` of the plan would show."""
        wd = self
        (wd.path / PLAN_FILE).unlink(missing_ok=True)
        result = await wd.run(
            "plan", input=False, json=IsFlagged, out=PLAN_FILE, lock_timeout=LOCK_TIMEOUT
        )
        if result.code != 0:
            raise failure(wd.res.id, "terraform plan", result, config_stage=True)
        return changes_nothing(result.messages)

    async def show(self) -> dict[str, Any]:
        """``tofu show -json`` of the plan file."""
        wd = self
        shown = await wd.run("show", PLAN_FILE, json=IsFlagged, no_color=IsFlagged)
        if shown.code != 0:
            raise failure(wd.res.id, "terraform show", shown, config_stage=False)
        try:
            doc = json.loads(shown.out)
        except ValueError:
            raise Unavailable(
                f"{wd.res.id}: terraform show -json printed no JSON", resource_id=wd.res.id
            ) from None
        return doc if isinstance(doc, dict) else {}


Previewed = tuple[Attributes | None, PreviewResult] | RuntimeFailure


async def batch_previews(wd: Workdir, members: list[Workdir]) -> list[Previewed]:
    """One ``tofu plan`` of a batch's merged configuration and state: each member's live
    object (as the plan's refresh found it) and preview, or its failure. A plan that changes
    nothing and found no drift needs no ``tofu show -json``: each member is then what the
    state holds (values and sensitive paths as show renders them)."""
    if await wd.plan_file():
        state = wd.local_state() or {}
        parts = managed_by_address(state)
        held = [
            await member.held({**state, "resources": parts.get(member.res.address, [])})
            for member in members
        ]
        if all(found is not None for found in held):
            return [found for found in held if found is not None]
    plan = await wd.show()
    changes, lives = resource_changes(plan), planned_lives(plan)
    out: list[Previewed] = []
    for member in members:
        block = await member.schema() if not member.res.provider.builtin else None
        try:
            preview = preview_result(member.res, changes.get(member.res.address), block)
        except RuntimeFailure as exc:
            out.append(exc)
            continue
        out.append((lives.get(member.res.address), preview))
    return out


def changes_nothing(messages: list[dict[str, Any]]) -> bool:
    """Whether a ``tofu plan -json``'s messages say it changes nothing: one change summary,
    every count zero, no planned change and no drift (``resource_drift``) reported."""
    summaries = [m for m in messages if m.get("type") == "change_summary"]
    if len(summaries) != 1:
        return False
    counts = summaries[0].get("changes")
    if not isinstance(counts, dict) or any(v for k, v in counts.items() if k != "operation"):
        return False
    return not any(m.get("type") in ("planned_change", "resource_drift") for m in messages)


def preview_result(
    res: TerraformResource, change: Mapping[str, Any] | None, block: dict[str, Any] | None
) -> PreviewResult:
    """The preview ``change`` (the plan's for ``res.address``; None: it has none) shows."""
    if change is None:
        raise Unavailable(f"{res.id}: the plan has no change for {res.address}", resource_id=res.id)
    body = change.get("change") or {}
    actions = list(body.get("actions") or [])
    after = body.get("after") if isinstance(body.get("after"), dict) else {}
    would_be = with_unknowns(after, body.get("after_unknown"))
    sensitive = {
        format_path(p)
        for key in ("after_sensitive", "before_sensitive")
        for p in marked_paths(body.get(key))
        if p
    }
    if block:
        sensitive.update(schema_sensitive_paths(block))
    return PreviewResult(
        would_be=dict(would_be) if isinstance(would_be, dict) else {},
        sensitive_paths=sorted(sensitive),
        replace="delete" in actions and "create" in actions,
    )
