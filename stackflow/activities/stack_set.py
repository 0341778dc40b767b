"""A set run's state activities: ``prepare_set`` (store and check every member's spec, its
``$stack.`` references and the set's order, and note each stack's release before the run)
and ``resolve_member`` (a member's references from what the stacks it reads just recorded,
stored as a new spec by ref: values never enter history)."""

from __future__ import annotations

import asyncio
from collections.abc import Container

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors
from stackflow.activities.heartbeat import heartbeating
from stackflow.core.errors import SpecError
from stackflow.core.paths import parse_path, touches
from stackflow.core.refs import StackRef
from stackflow.engine.masking import sensitive_paths_for
from stackflow.engine.spec import check_spec, parse_spec, parse_spec_text
from stackflow.engine.stack_set import (
    SET_READS,
    UNKNOWN_UNTIL_APPLY,
    check_set,
    check_waves,
    reference_value,
    references,
    resolve,
)
from stackflow.model.release import Operation, Phase
from stackflow.model.spec import SET_SECRETS, Spec
from stackflow.runtimes.policy import worker_policy
from stackflow.state.git_sources import git_cache, read_spec_file
from stackflow.temporal.operation import StatusView
from stackflow.temporal.stack_set import (
    ERROR_LIMIT,
    UNKNOWN_LIMIT,
    ForwardInput,
    MemberInput,
    PlannedMember,
    ResolveInput,
    ResolveResult,
    SetInput,
    SetOperation,
    SetPlan,
)

FORWARD_POLL_SECONDS = 1.0
"""How often ``forward_approval`` asks a member's run whether it waits for approval."""


def _stack(text: str) -> StackRef:
    project, _, workspace = text.partition("/")
    return StackRef(project, workspace)


class SetActivities:
    def __init__(self, deps: Deps) -> None:
        self.backend = deps.backend
        self.specs = deps.specs

    @activity.defn(name="prepare_set")
    async def prepare_set(self, inp: SetInput) -> SetPlan:
        with temporal_errors():
            return await asyncio.to_thread(self._prepare, inp)

    @activity.defn(name="forward_approval")
    async def forward_approval(self, inp: ForwardInput) -> bool:
        """Wait (heartbeating) until the member's run waits for approval, then approve it as
        the set's approver did; False when it ended without waiting."""
        with temporal_errors():
            handle = activity.client().get_workflow_handle(inp.workflow_id, run_id=inp.run_id)
            async with heartbeating(f"approval of {inp.workflow_id}"):
                deadline = asyncio.get_running_loop().time() + inp.wait_seconds
                while asyncio.get_running_loop().time() < deadline:
                    described = await handle.describe()
                    if described.status != WorkflowExecutionStatus.RUNNING:
                        return False
                    status = await handle.query("status", result_type=StatusView)
                    if status.phase == Phase.awaitingApproval:
                        await handle.execute_update("approve", {"by": inp.by, "reason": inp.reason})
                        return True
                    await asyncio.sleep(FORWARD_POLL_SECONDS)
            return False

    @activity.defn(name="resolve_member")
    async def resolve_member(self, inp: ResolveInput) -> ResolveResult:
        with temporal_errors():
            return await asyncio.to_thread(self._resolve, inp)

    # ---- prepare ---------------------------------------------------------------------------
    def _spec(self, member: MemberInput) -> tuple[Spec | None, str | None]:
        spec, ref = self._loaded(member)
        if spec is None or not member.context:
            return spec, ref
        spec = spec.model_copy(update={"context": {**spec.context, **member.context}})
        return spec, self.specs.put(spec)

    def _loaded(self, member: MemberInput) -> tuple[Spec | None, str | None]:
        where = f"{member.stack}"
        if member.spec is not None:
            spec = parse_spec(member.spec, source=f"{where}: spec")
            return spec, self.specs.put(spec)
        if member.spec_ref is not None:
            spec = self.specs.get(member.spec_ref)
            check_spec(spec, f"{where}: {member.spec_ref}")
            return spec, member.spec_ref
        if member.source is not None:
            text = read_spec_file(member.source, git_cache())
            spec = parse_spec_text(text, f"{where}: {member.source.path}@{member.source.commit}")
            return spec, self.specs.put(spec)
        return None, None

    def _recorded_ids(self, stack: StackRef) -> set[str] | None:
        revision = self.backend.latest_succeeded_revision(stack)
        if revision is None:
            return None
        return set(self.backend.resources(stack, revision))

    def _reads(self, stack: StackRef) -> list[str]:
        """The stacks the latest applied spec of ``stack`` read through ``$stack.``."""
        release = self.backend.latest_succeeded(stack)
        if release is None or release.operation == Operation.destroy or not release.spec:
            return []
        reads = release.spec.context.get(SET_READS)
        return [str(r) for r in reads] if isinstance(reads, list) else []

    def _prepare(self, inp: SetInput) -> SetPlan:
        loaded = [self._spec(m) for m in inp.members]
        destroy = inp.operation == SetOperation.destroy
        names = [str(m.stack) for m in inp.members]
        declared = [m.depends_on for m in inp.members]
        if destroy:  # what a stack read when it was applied orders the destroy too
            read = [[r for r in self._reads(m.stack) if r in names] for m in inp.members]
            declared = [[*d, *r] for d, r in zip(declared, read, strict=True)]
        order, reads = check_set(
            inp.name,
            names,
            [None if destroy else spec for spec, _ in loaded],
            declared,
            lambda stack: self._recorded_ids(_stack(stack)),
        )
        if inp.waves:
            check_waves(inp.name, names, order.deps, [w.members for w in inp.waves])
        if destroy:
            self._check_no_reader(inp.name, names)
        policy = worker_policy().approvals
        members = [
            PlannedMember(
                project=member.project,
                workspace=member.workspace,
                four_eyes=policy.four_eyes_for(member.project),
                spec_ref=ref,
                deps=deps,
                upstream=read.upstream,
                references=read.references,
                before=self.backend.latest_succeeded_revision(member.stack),
            )
            for member, (_, ref), deps, read in zip(
                inp.members, loaded, order.deps, reads, strict=True
            )
        ]
        four_eyes = any(m.four_eyes for m in members)
        return SetPlan(members=members, order=order.order, four_eyes=four_eyes)

    def _check_no_reader(self, name: str, names: list[str]) -> None:
        """A destroy leaves no stack outside the set reading a stack it destroys."""
        members = set(names)
        for stack in self.backend.stacks():
            if str(stack) in members:
                continue
            read = sorted(members.intersection(self._reads(stack)))
            if read:
                raise SpecError(
                    f"set {name}: destroy {read[0]}: {stack} (outside the set) still reads it "
                    "through $stack. references; destroy that stack too, or first"
                )

    # ---- resolve ---------------------------------------------------------------------------
    def _resolve(self, inp: ResolveInput) -> ResolveResult:
        spec = self.specs.get(inp.spec_ref)
        attributes = [r.attributes for r in spec.resources]
        recorded: dict[str, tuple[int, set[str]] | None] = {}

        def ids_of(stack: str) -> Container[str] | None:
            if stack not in recorded:
                ref = _stack(stack)
                revision = self.backend.latest_succeeded_revision(ref)
                recorded[stack] = None
                if revision is not None:
                    recorded[stack] = (revision, set(self.backend.resources(ref, revision)))
            known = recorded[stack]
            changing = inp.changing.get(stack)
            if known is None and changing is None:
                return None
            return (known[1] if known else set()) | set(changing or ())

        found = references(attributes, ids_of, str(inp.stack))
        if not found:
            return ResolveResult(spec_ref=inp.spec_ref)
        values: dict[str, object] = {}
        unknown: list[str] = []
        taken: list[object] = []
        """Values taken from another stack's secret fields (see SET_SECRETS)."""
        for ref in found:
            if ref.resource_id in inp.changing.get(ref.stack, ()):
                values[ref.text] = UNKNOWN_UNTIL_APPLY
                unknown.append(ref.text)
                continue
            known = recorded.get(ref.stack)
            state = (
                None
                if known is None
                else self.backend.resource_state(_stack(ref.stack), known[0], ref.resource_id)
            )
            values[ref.text] = reference_value(ref, None if state is None else state.attributes)
            assert state is not None
            secret = [parse_path(p) for p in sensitive_paths_for(state.type, state.attributes)]
            if secret and touches(secret, parse_path(ref.path)):
                taken.append(values[ref.text])
        context = {**spec.context, SET_READS: sorted({ref.stack for ref in found})}
        if taken:
            context[SET_SECRETS] = taken
        resolved = spec.model_copy(
            update={
                "context": context,
                "resources": [
                    r.model_copy(update={"attributes": resolve(r.attributes, values)})
                    for r in spec.resources
                ],
            }
        )
        return ResolveResult(
            spec_ref=self.specs.put(resolved),
            resolved=len(found) - len(unknown),
            unknown=[text[:ERROR_LIMIT] for text in unknown[:UNKNOWN_LIMIT]],
            unknown_count=len(unknown),
        )
