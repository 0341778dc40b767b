"""Names shared by the operation workflows: search attributes, phases, patch ids."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

from stackflow.model.release import Phase

PROJECT_KEY = SearchAttributeKey.for_keyword("StackflowProject")
WORKSPACE_KEY = SearchAttributeKey.for_keyword("StackflowWorkspace")
PHASE_KEY = SearchAttributeKey.for_keyword("StackflowPhase")

AWAITING_APPROVAL = Phase.awaitingApproval
FINALIZE_ON_EVERY_EXIT = "finalize-release-on-every-exit"
"""Patch: runs started before it end as they did (only preview failures were finalised)."""
AWAITING_DECISION = Phase.awaitingDecision
FAIL_FAST_STOPS_DELETES = "fail-fast-stops-delete-walk"
"""Patch: with fail_fast, a failure in the apply walk skips the delete walk."""
ACTIONS = ("Create", "Update", "Delete", "UnChanged")
DRIFT_KEY = SearchAttributeKey.for_bool("StackflowDrift")
"""Set by DriftWorkflow: whether its check found drift (the UI lists drifted stacks)."""
GROUP_READY_NODES = "group-ready-nodes"
"""Patch: ready nodes of cheap runtimes share one activity (OnPrem and Kubernetes; since
PLAN_GROUPING the runtimes whose rules say ``grouped``)."""
GROUP_TERRAFORM_NODES = "group-terraform-nodes"
"""Patch: ready Terraform nodes share a ``run_group`` activity too (its runtime runs them as
one tofu command); runs started before keep one activity per Terraform node."""
INDEX_DIFF_REFS = "index-diff-refs"
"""Patch: past DIFF_REFS_LIMIT preview batches with diffs, their refs fold into one index blob
(``index_diffs``), so the view, result and release carry a few refs at most."""
BOUNDED_NOT_OK = "bounded-not-ok"
"""Patch: a walk past NOT_OK_LIMIT nodes that failed or were skipped starts no further batch
(each batch's input lists them)."""
POLICY_GATE = "policy-gate"
"""Patch: between preview and approval the run's policy bundles are evaluated
(``evaluate_policy``): deny fails the run, require_approval waits for a person."""
RUN_EVENTS = "run-events"
"""Patch: the workflow appends what only it knows to the run's event stream (the change
summary, approval and decision waits, a preview's end) through ``append_events``."""
SETTLE_CANCELLED_NODES = "settle-cancelled-nodes"
"""Patch: a cancelled walk waits for its running node and group activities to end (each
finishes the runtime calls it had started and records them, then reports the cancel), so the
cancelled release holds every object the run changed and the next run does not apply it
again; runs started before close as soon as the cancel is requested."""
LOCAL_PHASE_WRITES = "local-phase-writes"
"""Patch: the release's phase is written by a local activity (``set_phase`` in the workflow
task, :mod:`stackflow.workflows.phases`) instead of an activity on the task queue."""
WHOLE_TERRAFORM_GROUPS = "whole-terraform-groups"
"""Patch: a group of ready Terraform nodes takes up to TERRAFORM_GROUP_LIMIT (one tofu command),
not GROUP_ROUNDS rounds of its share of the concurrency, and groups are keyed by runtime as
well as by step (a Terraform group holds no other runtime's nodes)."""
WHOLE_ONPREM_GROUPS = "whole-onprem-groups"
"""Patch: a group of ready OnPrem nodes takes up to ONPREM_GROUP_ROUNDS (32) per call of its
share of the concurrency, ONPREM_GROUP_LIMIT (one batch of its runtime) at most, not
GROUP_ROUNDS (8); groups are keyed by runtime as well as by step."""
SLIDING_PREVIEW_WINDOW = "sliding-preview-window"
"""Patch: a run's preview batches keep PREVIEW_WINDOW in flight, the next starting as soon as
the oldest's result is taken, instead of groups of that many (:mod:`.windows`)."""
CANCEL_IN_FLIGHT = "walk-cancels-in-flight-nodes"
"""Patch: a cancelled walk cancels its running nodes (runs from before it let them finish)."""
LOCAL_PREPARE = "local-prepare"
"""Patch: ``prepare_operation`` runs as a local activity, in the run's first workflow task
(like ``set_phase``): no activity round trip through the task queue and no workflow task after
it. Runs started before keep the activity they began with."""
LOCAL_EVENTS = "local-events"
"""Patch: ``append_events`` (an approval or decision wait, a preview's end) runs as a local
activity too, in the workflow task that announces it."""
HELD_ATTRIBUTES = "held-search-attributes"
"""Patch: the stack's search attributes go out with the run's first phase (one upsert, one
visibility write) instead of one upsert of their own just before it."""
APPROVER_DECIDES = "approver-decides"
"""Patch: ``auto_approve`` does not skip the approval wait of a four-eyes run (another person
approves), nor of a git commit's run whose spec takes over objects (an approver approves); a
drift repair's requester is who asked for the check. Runs started before skip as they did."""
PLAN_GROUPING = "grouping-from-plan"
"""Patch: the walk groups ready nodes as the run's plan says (``OperationPlan.grouping``,
decided by the prepare activity from each runtime's ``RuntimeRules.grouped``/``grouping``),
groups keyed by runtime, instead of the workflows' own list of grouped types (which a
plug-in runtime was not on); runs whose plan carries no grouping keep that list."""
SET_RUN_ON_RELEASES = "set-run-on-releases"
"""Patch: a set run's member runs are told the set run (``OperationInput.set_run``), which
their releases record; members of set runs started before record none."""
SET_CONTINUE_AS_NEW = "set-continue-as-new"
"""Patch: a set run whose history is past its ``history_budget`` (or that Temporal suggests
continue as new) continues as new before its apply, a retry or its rollback, carrying its
plan and view; set runs started before keep one history."""

LOCAL_SMALL_PREVIEW = "local-small-preview"
"""Patch: a run that nothing can stop between its preview and its walk (``auto_approve``, no
policy bundle, no approver to wait for) and whose preview is one batch of at most
LOCAL_PREVIEW_LIMIT on the run's own task queue previews in a local activity, in the workflow
task after ``prepare``: that task goes on to the walk, so such a run is two workflow tasks and
one activity, not three and two (and its previewing phase is not upserted apart). The
preview, its events, the gate and the apply of what it found are the same code. Runs started
before preview as an activity."""

BASELINE = "baseline-2026-11-29.2"
"""Patch: the run started on a build that knows every patch in :data:`BASELINED`, and records
this one marker for all of them (:mod:`stackflow.workflows.patches`)."""
BASELINE_2026_11_29 = "baseline-2026-11-29"
BASELINE_2026_11_26 = "baseline-2026-11-26"
"""The baseline before :data:`BASELINE`: runs that recorded it replay through
:data:`EARLIER_BASELINES`."""
BASELINED_2026_11_26 = frozenset(
    {
        FINALIZE_ON_EVERY_EXIT,
        FAIL_FAST_STOPS_DELETES,
        GROUP_READY_NODES,
        GROUP_TERRAFORM_NODES,
        INDEX_DIFF_REFS,
        BOUNDED_NOT_OK,
        POLICY_GATE,
        RUN_EVENTS,
        SETTLE_CANCELLED_NODES,
        LOCAL_PHASE_WRITES,
        WHOLE_TERRAFORM_GROUPS,
        WHOLE_ONPREM_GROUPS,
        SLIDING_PREVIEW_WINDOW,
        CANCEL_IN_FLIGHT,
        LOCAL_PREPARE,
        LOCAL_EVENTS,
        HELD_ATTRIBUTES,
    }
)
BASELINED_2026_11_29 = BASELINED_2026_11_26 | {PLAN_GROUPING}
BASELINED = BASELINED_2026_11_29 | {LOCAL_SMALL_PREVIEW}
"""Every patch id the workflows knew when :data:`BASELINE` was made. A later patch is asked
alone (its own marker) until a new baseline takes it in."""
EARLIER_BASELINES = (
    (BASELINE_2026_11_29, BASELINED_2026_11_29),
    (BASELINE_2026_11_26, BASELINED_2026_11_26),
)
"""Earlier baselines, newest first, with the patches each stands for: a run that recorded
one of them still replays (each is asked only when the newer ones are false)."""
