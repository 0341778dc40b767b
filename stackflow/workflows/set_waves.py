"""A set apply as a rollout (``SetInput.waves``): the waves in order, each applied at most
``max_parallel`` stacks at once, gated (``approval``, ``readiness``, ``policy``), recorded and
baked (a durable timer) before the next starts; past the error budget no later stack starts.
A part of :class:`~stackflow.workflows.stack_set.SetWorkflow`, which it is mixed into."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.model.release import Phase
    from stackflow.temporal.stack_set import (
        MemberPhase,
        MemberView,
        SetInput,
        SetOperation,
        SetPlan,
        SetView,
    )
    from stackflow.workflows.gate import Gate

NOT_OK = (MemberPhase.failed, MemberPhase.skipped)


class SetWaves:
    """The rollout steps of a set run (its view, gate, walk and approval are the set's)."""

    _view: SetView | None
    _gate: Gate

    def _failed(self) -> list[MemberView]:
        raise NotImplementedError

    def _show(self) -> None:
        raise NotImplementedError

    async def _approved(self, request: SetInput) -> bool:
        raise NotImplementedError

    async def _walk(
        self,
        plan: SetPlan,
        kind: SetOperation,
        order: list[int],
        deps: list[list[int]],
        parallel: int | None = None,
        watch: bool = False,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        raise NotImplementedError

    async def _rollout(self, plan: SetPlan, request: SetInput, deps: list[list[int]]) -> None:
        """The waves in order: each starts once the one before is recorded (and baked); past
        the error budget no later stack starts."""
        assert self._view is not None
        view = self._view

        def over_budget() -> bool:
            return len(self._failed()) > request.error_budget

        halted: str | None = None
        for w, wave in enumerate(request.waves):
            view.wave = w
            order = [i for i in plan.order if i in set(wave.members)]
            approved_now = w == 0 and not request.auto_approve  # the set's own approval
            if halted is None and wave.gate == "approval" and not approved_now:
                self._gate.decision = self._gate.approval = None
                if not await self._approved(request):
                    halted = f"wave {w + 1} was not approved"
                view.phase = Phase.applying
            if halted is None and wave.gate == "policy":
                halted = await self._policy_gate(plan, request, order, deps, w)
            if halted is None:
                await self._walk(
                    plan,
                    SetOperation.apply,
                    order,
                    deps,
                    parallel=wave.max_parallel,
                    watch=wave.gate == "readiness",
                    stop=over_budget,
                )
                if over_budget():
                    failed = len(self._failed())
                    halted = (
                        f"the rollout halted in wave {w + 1}: {failed} stack(s) failed, "
                        f"over its error budget of {request.error_budget}"
                    )
                    view.error, view.error_type = halted, "RolloutHalted"
                elif wave.bake_seconds and w < len(request.waves) - 1:
                    view.phase = "baking"
                    self._show()
                    await workflow.sleep(timedelta(seconds=wave.bake_seconds))
                    view.phase = Phase.applying
                continue
            for i in order:
                if view.members[i].phase == MemberPhase.failed:
                    continue  # refused by the wave's policy gate: it says why
                view.members[i].phase = MemberPhase.skipped
                view.members[i].error = f"not started: {halted}"
        if halted is not None and view.error is None:
            view.error, view.error_type = halted, "RolloutHalted"

    async def _policy_gate(
        self, plan: SetPlan, request: SetInput, order: list[int], deps: list[list[int]], w: int
    ) -> str | None:
        """``gate: policy``: preview the wave's stacks (their policies judge each) before any
        starts. A stack denied (or whose preview failed) stays failed and halts the rollout
        here; one whose policy requires an approval holds the wave for the set's approve
        Update. Returns why the rollout halts (None: the wave may start)."""
        assert self._view is not None
        view = self._view
        view.phase = Phase.previewing
        await self._walk(
            plan, SetOperation.preview, order, deps, parallel=request.waves[w].max_parallel
        )
        refused = [i for i in order if view.members[i].phase in NOT_OK]
        asks = any(view.members[i].policy == "require_approval" for i in order)
        for i in order:
            was = view.members[i]
            if i not in refused:
                view.members[i] = MemberView(
                    project=was.project,
                    workspace=was.workspace,
                    before=was.before,
                    runs=was.runs,
                    policy=was.policy,
                )
        if refused:
            first = view.members[refused[0]]
            return f"the rollout halted before wave {w + 1}: {first.stack}: {first.error}"
        if asks:
            self._gate.decision = self._gate.approval = None
            if not await self._approved(request):
                return f"wave {w + 1} was not approved (its policy requires an approval)"
        view.phase = Phase.applying
        return None
