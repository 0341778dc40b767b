"""A set run's state activities: ``prepare_set`` (store and check every member's spec, its
``$stack.`` references and the set's order, and note each stack's release before the run)
and ``resolve_member`` (a member's references from what the stacks it reads just recorded,
stored as a new spec by ref: values never enter history)."""

from __future__ import annotations

import asyncio
from collections.abc import Container

from temporalio import activity

from stackflow.activities.deps import Deps
from stackflow.activities.errors import temporal_errors
from stackflow.core.errors import SpecError
from stackflow.core.refs import StackRef
from stackflow.engine.spec import check_spec, parse_spec, parse_spec_text
from stackflow.engine.stack_set import (
    UNKNOWN_UNTIL_APPLY,
    order_members,
    reference_value,
    references,
    resolve,
)
from stackflow.model.spec import Spec
from stackflow.state.git_sources import git_cache, read_spec_file
from stackflow.temporal.stack_set import (
    UNKNOWN_LIMIT,
    MemberInput,
    PlannedMember,
    ResolveInput,
    ResolveResult,
    SetInput,
    SetOperation,
    SetPlan,
)


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

    @activity.defn(name="resolve_member")
    async def resolve_member(self, inp: ResolveInput) -> ResolveResult:
        with temporal_errors():
            return await asyncio.to_thread(self._resolve, inp)

    # ---- prepare ---------------------------------------------------------------------------
    def _spec(self, member: MemberInput) -> tuple[Spec | None, str | None]:
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

    def _prepare(self, inp: SetInput) -> SetPlan:
        names = [str(m.stack) for m in inp.members]
        index = {name: i for i, name in enumerate(names)}
        loaded = [self._spec(m) for m in inp.members]
        ids: dict[str, Container[str] | None] = {
            name: {r.id for r in spec.resources} if spec is not None else None
            for name, (spec, _) in zip(names, loaded, strict=True)
        }

        def ids_of(stack: str) -> Container[str] | None:
            if stack not in ids:
                ids[stack] = self._recorded_ids(_stack(stack))
            return ids[stack]

        planned: list[PlannedMember] = []
        depends: list[list[str]] = []
        for member, (spec, ref) in zip(inp.members, loaded, strict=True):
            found = (
                references([r.attributes for r in spec.resources], ids_of, str(member.stack))
                if spec is not None and inp.operation != SetOperation.destroy
                else []
            )
            upstream: dict[int, list[str]] = {}
            for found_ref in found:
                if found_ref.stack == str(member.stack):
                    raise SpecError(
                        f"set {inp.name}: {member.stack}: {found_ref.text}: a $stack. reference "
                        "to its own stack (use $kusion_path)"
                    )
                if found_ref.stack in index:
                    ids_read = upstream.setdefault(index[found_ref.stack], [])
                    if found_ref.resource_id not in ids_read:
                        ids_read.append(found_ref.resource_id)
            depends.append([*member.depends_on, *(names[i] for i in upstream)])
            planned.append(
                PlannedMember(
                    project=member.project,
                    workspace=member.workspace,
                    spec_ref=ref,
                    upstream=upstream,
                    references=len(found),
                    before=self.backend.latest_succeeded_revision(member.stack),
                )
            )
        order = order_members(names, depends, f"set {inp.name}")
        for done, deps in zip(planned, order.deps, strict=True):
            done.deps = deps
        return SetPlan(members=planned, order=order.order)

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
        resolved = spec.model_copy(
            update={
                "resources": [
                    r.model_copy(update={"attributes": resolve(r.attributes, values)})
                    for r in spec.resources
                ]
            }
        )
        return ResolveResult(
            spec_ref=self.specs.put(resolved),
            resolved=len(found) - len(unknown),
            unknown=unknown[:UNKNOWN_LIMIT],
            unknown_count=len(unknown),
        )
