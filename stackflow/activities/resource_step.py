"""What happens to one resource: the one place a resource's life is written.

Building the runtime request (for an apply, a delete, a preview or a refresh), resolving
``$kusion_path`` references from the recorded state of the dependencies, taint (inputs that
take a dependency's secret), the worker policy right before the runtime call, the call
itself, and which paths of the result are recorded sensitive. The activities of every phase
use it: a single node's apply/delete and a group of nodes (:mod:`.walk`), a preview
(:mod:`.preview`) and a refresh (:mod:`.observe`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stackflow.activities.deps import Deps
from stackflow.core.errors import SpecError
from stackflow.core.ref_cache import RefCache
from stackflow.core.refs import RunRef, StackRef
from stackflow.engine.diff import Action, Change, diff_resource
from stackflow.engine.graph import find_references, match_reference, resolve_references
from stackflow.engine.masking import (
    RECORDED_SENSITIVE_KEY,
    SecretSet,
    derived_sensitive_paths,
    equal_value_paths,
    input_paths,
    recorded_sensitive,
    sensitive_paths_for,
    sensitive_values,
    tainted_paths,
)
from stackflow.model.spec import SET_SECRETS, Resource
from stackflow.runtimes.base import ResourceRequest, Runtime, RuntimeOptions
from stackflow.temporal.activity_io import GroupInput, NodeInput

UNKNOWN_UNTIL_APPLY = "(known after apply)"
COALESCED_PARALLELISM = 256
"""Calls in flight at once to a runtime that merges concurrent calls into one command (as many
as one command takes: the Terraform runtime's ``BATCH_LIMIT``)."""
STACK_SECRETS_KEPT = 256
"""Stack revisions whose known secrets (digests) a worker remembers."""

Fence = Callable[[], Awaitable[None]]
"""Checks, right before a runtime call, that the run still holds the stack."""


def digest(attributes: Mapping[str, Any]) -> str:
    """A short digest of a resource's live attributes (what a node's result carries)."""
    body = json.dumps(attributes, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def mark_unknown(value: Any, known_ids: Container[str]) -> Any:
    """``value`` with every ``$kusion_path`` reference shown as known only after apply."""
    if isinstance(value, str):
        return UNKNOWN_UNTIL_APPLY if match_reference(value, known_ids) else value
    if isinstance(value, Mapping):
        return {k: mark_unknown(v, known_ids) for k, v in value.items()}
    if isinstance(value, list):
        return [mark_unknown(v, known_ids) for v in value]
    return value


def referenced_ids(resource: Resource, known_ids: Iterable[str]) -> list[str]:
    return sorted({ref.resource_id for ref in find_references(resource.attributes, known_ids)})


def desired_from_recorded(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """Recorded attributes as a delete's desired attributes: without the list of sensitive
    paths stackflow added (runtimes validate their attributes; prior_state keeps it)."""
    return {k: v for k, v in recorded.items() if k != RECORDED_SENSITIVE_KEY}


def recorded_request(recorded: Resource) -> ResourceRequest:
    """The request for a recorded resource (a delete, a refresh's read): its recorded
    attributes as the desired ones and as the prior state."""
    return ResourceRequest(
        id=recorded.id,
        type=str(recorded.type),
        attributes=desired_from_recorded(recorded.attributes),
        extensions=recorded.extensions,
        prior_state=recorded.attributes,
    )


def taint(
    resource: Resource, referenced: Iterable[str], state: Mapping[str, Resource]
) -> list[str]:
    """Paths of ``resource`` that take a sensitive value of a recorded dependency
    (``referenced``: the ids it references, :func:`referenced_ids`)."""
    deps = {
        rid: (str(state[rid].type), state[rid].attributes) for rid in referenced if rid in state
    }
    return tainted_paths(resource.attributes, deps) if deps else []


def known_secrets(
    resource: Resource,
    referenced: Iterable[str],
    state: Mapping[str, Resource],
    context: Mapping[str, Any],
) -> set[str]:
    """The plaintext values known sensitive for this resource's run: the sensitive values
    of the recorded state of what it references (``referenced``, :func:`referenced_ids`) and
    its own, ``context.env`` and what a set's ``$stack.`` references took from secrets (the
    rest of the stack's: :class:`StackSecrets`)."""
    ids = {resource.id, *referenced}
    secrets: set[str] = set()
    for rid in ids:
        recorded = state.get(rid)
        if recorded is not None:
            paths = sensitive_paths_for(str(recorded.type), recorded.attributes)
            secrets |= sensitive_values(recorded.attributes, paths)
    env = context.get("env")
    if isinstance(env, Mapping):
        secrets |= sensitive_values(dict(env), ["*"])
    taken = context.get(SET_SECRETS)  # what $stack. references took from another stack's secrets
    if isinstance(taken, list):
        secrets |= sensitive_values(taken, ["*"])
    return secrets


def sensitive_inputs(
    resource_type: str,
    desired: Mapping[str, Any],
    tainted: list[str],
    reported: list[str],
) -> list[str]:
    """Paths of the desired attributes (references resolved) that hold a sensitive value:
    taint, what the type says (a Secret's data), and what the runtime reports sensitive
    that is an input rather than a value it computed."""
    own = sensitive_paths_for(resource_type, desired)
    return sorted({*tainted, *own, *input_paths(desired, reported)})


def sensitive_record(
    resource_type: str,
    desired: Mapping[str, Any],
    live: Mapping[str, Any],
    tainted: list[str],
    secrets: Container[str],
) -> list[str]:
    """Every path of ``live`` to record as sensitive: what the runtime reported, the tainted
    inputs, what it derived from a sensitive input (:func:`derived_sensitive_paths`) and any
    value equal to a known sensitive value (:func:`equal_value_paths`)."""
    reported = recorded_sensitive(live)
    inputs = sensitive_inputs(resource_type, desired, tainted, reported)
    return sorted(
        {
            *reported,
            *tainted,
            *derived_sensitive_paths(desired, live, inputs),
            *equal_value_paths(live, secrets),
        }
    )


async def pre_check(runtime: Runtime, request: ResourceRequest, options: RuntimeOptions) -> None:
    """The worker policy right before a runtime call (resolved attributes), unless the
    runtime checks it inside that call anyway."""
    if not runtime.checks_every_call:
        await asyncio.to_thread(runtime.check_policy, request, options)


@dataclass
class ApplyJob:
    """One node ready to apply (see :meth:`ResourceStep.apply_job`)."""

    resource: Resource
    request: ResourceRequest
    runtime: Runtime
    options: RuntimeOptions
    depends: list[str]
    tainted: list[str]
    secrets: Container[str]

    def applied(self, live: dict[str, Any]) -> Resource:
        """The state to record: the live attributes, with every path that may hold a secret
        marked (:func:`sensitive_record`), so it is sealed at rest and masked wherever shown."""
        marked = sensitive_record(
            self.request.type, self.request.attributes, live, self.tainted, self.secrets
        )
        if marked or RECORDED_SENSITIVE_KEY in live:
            live = {**live, RECORDED_SENSITIVE_KEY: marked}
        return Resource(
            id=self.resource.id,
            type=self.resource.type,
            attributes=live,
            depends_on=self.depends,
            extensions=self.resource.extensions,
        )


class StackSecrets:
    """The sensitive values of each stack's latest succeeded release, as keyed digests
    (:class:`SecretSet`), remembered per revision (a succeeded release's state never
    changes): the equal-value rule looks for them in every resource of a run. One reading
    per revision (:class:`RefCache` loads single flight): the batches of a run that start
    together wait for it, where each read the whole state (50,000 files: 156 MB at once per
    batch)."""

    def __init__(self, deps: Deps) -> None:
        self.backend = deps.backend
        self.cache = deps.cache
        self._known: RefCache[tuple[StackRef, int], SecretSet] = RefCache(STACK_SECRETS_KEPT)

    def of(self, stack: StackRef) -> SecretSet:
        revision = self.backend.latest_succeeded_revision(stack)
        if revision is None:
            return SecretSet()
        return self._known.get((stack, revision), self._read)

    def _read(self, key: tuple[StackRef, int]) -> SecretSet:
        values: set[str] = set()
        for resource in self.cache.each_prior(key[0]):  # one opened at a time
            paths = sensitive_paths_for(str(resource.type), resource.attributes)
            values |= sensitive_values(resource.attributes, paths)
        return SecretSet(values)


class ResourceStep:
    """One resource's request, checks and runtime call, for every phase."""

    def __init__(self, deps: Deps) -> None:
        self.registry = deps.registry
        self.specs = deps.specs
        self.secrets = StackSecrets(deps)

    # ---- options and requests ----------------------------------------------------------------
    def options(
        self,
        stack: StackRef,
        spec_ref: str | None,
        *,
        force: bool,
        adopt: bool,
        revision: int | None = None,
        run: RunRef | None = None,
        preview_of: int | None = None,
    ) -> RuntimeOptions:
        """Per-run runtime options; the spec's ``context`` travels by ref, never in history."""
        context = self.specs.get(spec_ref).context if spec_ref else {}
        return RuntimeOptions(
            project=stack.project,
            workspace=stack.workspace,
            force=force,
            adopt=adopt,
            context=context,
            revision=revision,
            owner=run,
            preview_of=preview_of,
        )

    def node_options(self, inp: NodeInput | GroupInput, run: RunRef) -> RuntimeOptions:
        return self.options(
            inp.stack,
            inp.spec_ref,
            force=inp.force,
            adopt=inp.adopt,
            revision=inp.revision,
            run=run,
        )

    @staticmethod
    def ids_to_read(inp: NodeInput, spec_resources: Mapping[str, Resource]) -> list[str]:
        """The node's id and the ids its ``$kusion_path`` references name (their recorded
        state resolves them)."""
        if inp.spec_ref is None:
            raise SpecError(f"{inp.resource_id}: apply needs the spec (spec_ref is missing)")
        resource = spec_resources.get(inp.resource_id)
        if resource is None:
            raise SpecError(f"{inp.resource_id}: not in spec {inp.spec_ref}")
        references = find_references(resource.attributes, spec_resources)
        return [resource.id, *sorted({ref.resource_id for ref in references})]

    def apply_job(
        self,
        inp: NodeInput,
        spec_resources: Mapping[str, Resource],
        state: Mapping[str, Resource],
        options: RuntimeOptions,
        stack_secrets: SecretSet,
    ) -> ApplyJob:
        """What applying one node takes: the request with references resolved from the
        recorded state of the dependencies, its runtime, and how to record the result."""
        resource = spec_resources[inp.resource_id]
        attributes = resource.attributes
        references = find_references(attributes, spec_resources)
        if references:
            live_deps = {rid: r.attributes for rid, r in state.items() if rid != resource.id}
            attributes = resolve_references(attributes, live_deps)
        recorded = state.get(resource.id)
        referenced = sorted({ref.resource_id for ref in references})
        tainted = taint(resource, referenced, state)
        request = ResourceRequest(
            id=resource.id,
            type=str(resource.type),
            attributes=attributes,
            extensions=resource.extensions,
            prior_state=recorded.attributes if recorded else None,
            sensitive_paths=tainted,
        )
        return ApplyJob(
            resource=resource,
            request=request,
            runtime=self.registry.get(str(resource.type)),
            options=options,
            # dependsOn plus the $kusion_path edges: destroy and deletions walk them in reverse
            depends=sorted({*resource.depends_on, *referenced}),
            tainted=tainted,
            secrets=SecretSet(known_secrets(resource, referenced, state, options.context))
            | stack_secrets,
        )

    # ---- the runtime calls ---------------------------------------------------------------------
    async def apply(self, job: ApplyJob, fence: Fence | None = None) -> dict[str, Any]:
        """The worker policy on the resolved request, the fence, then the runtime's apply."""
        await pre_check(job.runtime, job.request, job.options)
        if fence is not None:
            await fence()
        return await job.runtime.apply(job.request, job.options)

    async def delete(
        self, recorded: Resource, options: RuntimeOptions, fence: Fence | None = None
    ) -> None:
        """The worker policy on the recorded resource, the fence, then the runtime's delete."""
        request = recorded_request(recorded)
        runtime = self.registry.get(str(recorded.type))
        await pre_check(runtime, request, options)
        if fence is not None:
            await fence()
        await runtime.delete(request, options)

    async def read_recorded(
        self, recorded: Resource, options: RuntimeOptions
    ) -> dict[str, Any] | None:
        """What is live of a recorded resource (a refresh), after the worker policy."""
        request = recorded_request(recorded)
        runtime = self.registry.get(str(recorded.type))
        await pre_check(runtime, request, options)
        return await runtime.read(request, options)

    # ---- previews ------------------------------------------------------------------------------
    async def preview_apply(
        self,
        resource: Resource,
        spec_resources: Mapping[str, Resource],
        prior: Mapping[str, Resource],
        current: Mapping[str, Resource],
        options: RuntimeOptions,
        ignore_fields: list[str],
        stack_secrets: SecretSet,
    ) -> Change:
        """The change applying ``resource`` would make, masked as the apply will record it."""
        runtime = self.registry.get(str(resource.type))
        recorded = current.get(resource.id)
        referenced = referenced_ids(resource, spec_resources)
        attributes, resolved = self.resolve_for_preview(resource, referenced, current)
        tainted = taint(resource, referenced, current)
        request = ResourceRequest(
            id=resource.id,
            type=str(resource.type),
            attributes=attributes,
            extensions=resource.extensions,
            prior_state=recorded.attributes if recorded else None,
            sensitive_paths=tainted if resolved else [],
        )
        live, result = await runtime.observe(request, options, with_preview=resolved)
        sensitive = sensitive_paths_for(str(resource.type), resource.attributes)
        sensitive += tainted
        if recorded is not None:
            sensitive += recorded_sensitive(recorded.attributes)
        reported = result.sensitive_paths if result is not None else []
        if result is not None:
            would_be = result.would_be
            sensitive = result.sensitive_paths + sensitive
        else:
            # A dependency this run creates first: the referenced value is not known yet.
            would_be = mark_unknown(resource.attributes, spec_resources)
        # what the runtime would compute from a sensitive input, and known secrets wherever
        # they turn up, are masked as the apply will record them
        inputs = sensitive_inputs(str(resource.type), attributes, tainted, reported)
        secrets = (
            SecretSet(known_secrets(resource, referenced, current, options.context)) | stack_secrets
        )
        for side, computed_only in ((would_be, False), (live, True)):
            sensitive += derived_sensitive_paths(
                attributes,
                side,
                inputs,
                placeholders=(UNKNOWN_UNTIL_APPLY,),
                computed_only=computed_only,
            )
            sensitive += equal_value_paths(side, secrets)
        before = prior.get(resource.id)
        change = diff_resource(
            resource.id,
            str(resource.type),
            would_be,
            live,
            before.attributes if before else None,
            ignore_fields=ignore_fields,
            sensitive_paths=sensitive,
            removed_paths=result.removed_paths if result is not None else (),
        )
        if recorded is None and change.action is Action.UnChanged:
            # Matches already, but this stack has not recorded it: apply adopts it into state.
            change.unrecorded = True
        return change

    @staticmethod
    def resolve_for_preview(
        resource: Resource, referenced: list[str], current: Mapping[str, Resource]
    ) -> tuple[dict[str, Any], bool]:
        """Attributes with references resolved from the recorded state of the dependencies
        (``referenced``: their ids, :func:`referenced_ids`), and whether that was possible
        (not when a dependency is not applied yet)."""
        if not referenced:
            return resource.attributes, True
        if any(rid not in current for rid in referenced):
            return resource.attributes, False
        live = {rid: current[rid].attributes for rid in referenced}
        try:
            return resolve_references(resource.attributes, live), True
        except SpecError:
            return resource.attributes, False

    async def preview_delete(
        self, resource: Resource, prior: Mapping[str, Resource], options: RuntimeOptions
    ) -> Change:
        """The change deleting the recorded ``resource`` would make."""
        runtime = self.registry.get(str(resource.type))
        live = await runtime.read(recorded_request(resource), options)
        before = prior.get(resource.id)
        return diff_resource(
            resource.id,
            str(resource.type),
            None,
            live if live is not None else resource.attributes,
            before.attributes if before else resource.attributes,
            sensitive_paths=sensitive_paths_for(str(resource.type), resource.attributes),
        )
