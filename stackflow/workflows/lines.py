"""The preview as a run keeps it (PreviewLines) and what the release keeps of it."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import (
    ApplicationError,
)

with workflow.unsafe.imports_passed_through():
    from stackflow.engine.budget import BUDGET, fit_changes
    from stackflow.temporal.activity_io import DescribeInput, PreviewBatchInput, PreviewBatchResult
    from stackflow.temporal.operation import (
        DETAIL_LIMIT,
        NodeResult,
        NodeStatus,
        OperationPlan,
        references_entry,
    )
    from stackflow.temporal.wire import (
        ActionCode,
        ChangeFlags,
        DescribeItem,
        LineRef,
        decode_changes,
    )
    from stackflow.workflows.constants import ACTIONS


def summarise(changes: list[dict[str, Any]], limit: int | None = None) -> dict[str, Any]:
    """``{"changes": [...], "summary": {...}}``; past ``limit`` changes, the list keeps the
    first ``limit`` changes that are not UnChanged (the summary always counts all)."""
    summary = dict.fromkeys(ACTIONS, 0)
    for change in changes:
        summary[change["action"]] = summary.get(change["action"], 0) + 1
    if limit is not None and len(changes) > limit:
        kept = [c for c in changes if c["action"] != "UnChanged"][:limit]
        return {"changes": kept, "summary": summary, "truncated": True}
    return {"changes": changes, "summary": summary}


class PreviewLines:
    """The preview as a run keeps it: an action code and flags per line, the full change
    (with diffs) for the first lines only (as ``PreviewBatchResult.details`` bring them),
    the references of UnChanged nodes. Deterministic; the order of lines is the order of
    the preview batches (each: its nodes, then its deletions)."""

    def __init__(self, plan: OperationPlan) -> None:
        self.plan_ref = plan.plan_ref
        self.node_codes = [ActionCode.unchanged] * plan.node_count
        self.node_flags = [ChangeFlags.none] * plan.node_count
        self.del_codes = [ActionCode.unchanged] * plan.deletion_count
        self.del_flags = [ChangeFlags.none] * plan.deletion_count
        self.order: list[LineRef] = []
        self.details: dict[LineRef, dict[str, Any]] = {}
        self.refs: dict[int, list[tuple[int, str]]] = {}
        self.settled: dict[int, tuple[int, str]] = {}
        self.record_only: list[int] = []
        self.diff_refs: list[str] = []
        """The batches' full diffs in the state backend (``preview --full``)."""
        self.left_out: dict[str, Any] | None = (
            {
                "count": plan.left_out_count,
                "resources": [x.model_dump(mode="json", exclude_none=True) for x in plan.left_out],
            }
            if plan.left_out_count
            else None
        )
        """What --target/--exclude left out (capped list, full count)."""
        self._view: dict[str, Any] | None = None

    def add(self, call: PreviewBatchInput, result: PreviewBatchResult) -> None:
        end = min(call.end, len(self.node_codes))
        keys = [LineRef(False, i) for i in range(call.start, end)]
        keys += [LineRef(True, i) for i in range(call.start, min(call.end, len(self.del_codes)))]
        if len(result.codes) != 2 * len(keys):
            raise ApplicationError(
                f"preview batch {call.start}: {len(result.codes) // 2} changes for "
                f"{len(keys)} resources (the plan changed under the run?)",
                non_retryable=True,
            )
        for n, (key, (code, flag)) in enumerate(
            zip(keys, decode_changes(result.codes), strict=True)
        ):
            codes, flags = self._lists(key.deletion)
            codes[key.plan_index] = code
            flags[key.plan_index] = flag
            if result.details:
                self.details[key] = result.details[n]
        self.order.extend(keys)
        self._view = None
        if result.diff_ref:
            self.diff_refs.append(result.diff_ref)
        self.diff_refs.extend(result.more_diff_refs)
        for node, ref, path in result.refs:
            self.refs.setdefault(node, []).append((ref, path))

    def fold_diffs(self, index_ref: str) -> None:
        """The diff refs so far are now held by one index blob."""
        self.diff_refs = [index_ref]
        self._view = None

    def _lists(self, deletion: bool) -> tuple[list[ActionCode], list[ChangeFlags]]:
        if not deletion:
            return self.node_codes, self.node_flags
        return self.del_codes, self.del_flags

    def action(self, key: LineRef) -> str:
        return self._lists(key.deletion)[0][key.plan_index].action

    def settle(self) -> None:
        """Second pass, in dependency order.

        A node whose attributes reference a field that this run creates or changes on another
        resource may change too, though its own preview (from the recorded values) found
        nothing: it becomes an Update "known after apply", as Terraform shows it, and is
        applied after its dependency. UnChanged nodes this stack has not recorded yet are
        applied (a no-op) only to record their state (``record_only``).
        """
        self._view = None
        for index, code in enumerate(self.node_codes):
            if code != ActionCode.unchanged:
                continue
            moved = next(
                ((ref, path) for ref, path in self.refs.get(index, []) if self._touches(ref, path)),
                None,
            )
            if moved is not None:
                self.node_codes[index] = ActionCode.update
                self.settled[index] = moved
                change = self.details.get(LineRef(False, index))
                if change is not None:
                    change["action"] = "Update"
                    change["diff"] = [
                        *change.get("diff", []),
                        references_entry(self._moved_text(*moved)),
                    ]
            elif self.node_flags[index] & ChangeFlags.unrecorded:
                self.record_only.append(index)

    def _moved_text(self, ref: int, path: str) -> str:
        detail = self.details.get(LineRef(False, ref))
        rid = detail["id"] if detail is not None else f"#{ref}"
        return f"{rid}.{path}" if path else rid

    def _touches(self, ref: int, path: str) -> bool:
        detail = self.details.get(LineRef(False, ref))
        if detail is not None and (detail.get("diff_more") or detail.get("diff_omitted")):
            # only part of its diff is here: any field may move
            return self.node_codes[ref] in (ActionCode.create, ActionCode.update)
        change = {
            "action": self.node_codes[ref].action,
            "diff": detail.get("diff", []) if detail is not None else [],
        }
        return _touches(change, path)

    def undescribed(self) -> DescribeInput | None:
        """The lines the view shows that the run holds only as codes (large runs)."""
        if len(self.order) <= DETAIL_LIMIT:
            return None
        items = []
        for key in self._shown():
            if key in self.details:
                continue
            codes, flags = self._lists(key.deletion)
            i = key.plan_index
            moved = None if key.deletion else self.settled.get(i)
            items.append(DescribeItem.of(key, codes[i].action, flags[i], moved))
        if not items:
            return None
        assert self.plan_ref is not None
        return DescribeInput(plan_ref=self.plan_ref, items=items)

    def described(self, request: DescribeInput, changes: list[dict[str, Any]]) -> None:
        self._view = None
        for item, change in zip(request.items, changes, strict=True):
            self.details[item.line] = change

    def _shown(self) -> list[LineRef]:
        if len(self.order) <= DETAIL_LIMIT:
            return self.order
        shown = []
        for key in self.order:
            if self.action(key) != "UnChanged":
                shown.append(key)
                if len(shown) == DETAIL_LIMIT:
                    break
        return shown

    def view(self) -> dict[str, Any]:
        """``{"changes": [...], "summary": {...}, "diff_refs": [...]}`` (see ``summarise``),
        within half the byte budget (diffs past it are omitted; the summary counts every
        line). Computed once; the preview does not change after it is settled."""
        if self._view is not None:
            return self._view
        summary = dict.fromkeys(ACTIONS, 0)
        for code in (*self.node_codes, *self.del_codes):
            summary[code.action] += 1
        shown = [self.details[key] for key in self._shown() if key in self.details]
        view: dict[str, Any] = {"changes": fit_changes(shown, BUDGET // 2), "summary": summary}
        if len(self.order) > DETAIL_LIMIT:
            view["truncated"] = True
        if self.diff_refs:
            view["diff_refs"] = list(self.diff_refs)
        if self.left_out is not None:
            view["left_out"] = self.left_out
        self._view = view
        return view

    def __len__(self) -> int:
        return len(self.order)

    def drift_summary(self, id_limit: int) -> dict[str, Any]:
        """Counts of a drift check over the plan nodes: ``drifted`` (live moved away from
        the recorded state), ``missing`` (recorded but gone), ``pending`` (the spec would
        still change it, no drift), the first drifted ids known (shown lines)."""
        drifted = missing = pending = 0
        ids: list[str] = []
        for i, code in enumerate(self.node_codes):
            if self.node_flags[i] & ChangeFlags.drift:
                if code == ActionCode.create:
                    missing += 1
                else:
                    drifted += 1
                detail = self.details.get(LineRef(False, i))
                if detail is not None and len(ids) < id_limit:
                    ids.append(str(detail["id"]))
            elif code != ActionCode.unchanged:
                pending += 1
        return {
            "checked": len(self.node_codes),
            "drifted": drifted,
            "missing": missing,
            "pending": pending,
            "ids": ids,
        }

    def picks(self) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        """(plan index, action) of the nodes to apply and of the deletions to run."""
        record_only = dict.fromkeys(self.record_only)
        to_apply = [
            (i, code.action)
            for i, code in enumerate(self.node_codes)
            if code in (ActionCode.create, ActionCode.update) or i in record_only
        ]
        to_delete = [
            (i, "Delete") for i, code in enumerate(self.del_codes) if code == ActionCode.delete
        ]
        return to_apply, to_delete


def range_size(call: PreviewBatchInput, plan: OperationPlan) -> int:
    nodes = max(0, min(call.end, plan.node_count) - call.start)
    return nodes + max(0, min(call.end, plan.deletion_count) - call.start)


def _touches(change: dict[str, Any], path: str) -> bool:
    """Whether a dependency's planned change may alter the value at ``path`` (dotted)."""
    if change["action"] == "Create":
        return True
    if change["action"] != "Update":
        return False
    diff = change.get("diff") or []
    if not diff or not path:
        return True  # no per-field detail (large runs) or the whole object is referenced
    for entry in diff:
        changed = entry["path"]
        if changed == "(references)" or changed == path:
            return True
        for a, b in ((changed, path), (path, changed)):
            if a.startswith(b) and a[len(b)] in ".[":
                return True
    return False


def brief_changes(view: dict[str, Any]) -> dict[str, Any]:
    """What the release keeps of the preview (``view``, as the run shows it): one line per
    resource shown (diffs stay in history) and the summary, which counts every line."""
    briefs = [
        {"id": c["id"], "type": c["type"], "action": c["action"], "drift": c.get("drift", False)}
        for c in view["changes"]
    ]
    brief: dict[str, Any] = {"changes": briefs, "summary": view["summary"]}
    if view.get("truncated"):
        brief["truncated"] = True
    if view.get("diff_refs"):
        brief["diff_refs"] = view["diff_refs"]
    if view.get("left_out"):
        brief["left_out"] = view["left_out"]
    return brief


RESULT_BRIEF_LIMIT = 50
"""Changed resources a brief result names (``OperationInput.brief_result``)."""


def result_brief(
    view: dict[str, Any], results: list[NodeResult]
) -> tuple[dict[str, Any], list[NodeResult]]:
    """A run's changes and node results as a brief result keeps them: the summary, the
    first RESULT_BRIEF_LIMIT resources that change (id and action; ``truncated`` when more
    do) and the first RESULT_BRIEF_LIMIT results that did not succeed."""
    changed = [
        {"id": c["id"], "action": c["action"]}
        for c in view["changes"]
        if c["action"] != "UnChanged"
    ]
    brief: dict[str, Any] = {"changes": changed[:RESULT_BRIEF_LIMIT], "summary": view["summary"]}
    if len(changed) > RESULT_BRIEF_LIMIT or view.get("truncated"):
        brief["truncated"] = True
    not_ok = [r for r in results if r.status != NodeStatus.succeeded]
    return brief, not_ok[:RESULT_BRIEF_LIMIT]
