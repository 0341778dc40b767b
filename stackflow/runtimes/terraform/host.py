"""The Terraform runtime on this worker: where its working directories live, the tools their
commands run with, the worker policy's check of a resource, and the states the backend kept.
What the runtime's single-resource verbs (:mod:`.runtime`) and its batches
(:mod:`.batching`) share."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from stackflow.core.config import stackflow_home
from stackflow.core.refs import StackRef
from stackflow.runtimes.base import RuntimeOptions
from stackflow.runtimes.terraform.batch import StateLoader
from stackflow.runtimes.terraform.config import TerraformResource
from stackflow.runtimes.terraform.policy import check_terraform, terraform_env
from stackflow.runtimes.terraform.state import State
from stackflow.runtimes.terraform.workdir import Toolchain, resource_workdir, terraform_root
from stackflow.state.protocols import TerraformStateStore


class Host:
    """This worker's side of the Terraform runtime."""

    def __init__(
        self, root: Path | None, tools: Toolchain, backend: TerraformStateStore | None
    ) -> None:
        self._root = root
        self.tools = tools
        self.backend = backend
        """Where each resource's state is kept between commands (None: only on this host)."""
        self._states = StateLoader(self._kept_states)

    def root(self) -> Path:
        return self._root if self._root is not None else terraform_root(stackflow_home())

    def workdir_path(self, resource_id: str, options: RuntimeOptions) -> Path:
        return resource_workdir(self.root(), options.project, options.workspace, resource_id)

    def check(self, res: TerraformResource, options: RuntimeOptions) -> None:
        """The worker policy's check of the resource (before anything is written or run)."""
        policy = self.tools.policy.for_project(options.project, res.id)
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

    async def stored(self, resource_id: str, options: RuntimeOptions) -> State | None:
        """The state the backend kept for the resource after its last command."""
        if self.backend is None:
            return None
        body = await self._states.get(options.stack, resource_id)
        return json.loads(body) if body else None

    def _kept_states(self, stack: StackRef, ids: list[str]) -> Mapping[str, str]:
        assert self.backend is not None
        return self.backend.get_terraform_states(stack, ids)
