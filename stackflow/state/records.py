"""Records beside the releases: drift reports, the latest OpenTofu state of each Terraform
resource and the plans an apply's preview saved for it
(:class:`~stackflow.state.protocols.DriftReportStore`,
:class:`~stackflow.state.protocols.TerraformStateStore`)."""

from __future__ import annotations

import base64
import builtins
import json
from collections.abc import Iterable, Mapping
from datetime import UTC

import sqlalchemy as sa

from stackflow.core.refs import RunRef, StackRef
from stackflow.model.drift import DriftReport, DriftSummary
from stackflow.state.models import (
    CHUNK,
    as_utc,
    now,
)
from stackflow.state.schema import (
    drift_reports,
    terraform_plans,
    terraform_states,
)
from stackflow.state.writes import ReleaseWrites


class Records(ReleaseWrites):
    # ---- drift reports ---------------------------------------------------------------------

    def put_drift_report(self, report: DriftReport) -> None:
        """Keep what a drift check found (no lock: a check reads only); idempotent per
        (stack, checked_at)."""
        summary = report.summary.model_dump(mode="json")
        if report.repair_workflow_id:
            summary["repair_workflow_id"] = report.repair_workflow_id
        values = {
            "revision": report.revision,
            "drifted": report.drifted,
            "summary": summary,
            "report_ref": report.report_ref,
            "workflow_id": report.workflow_id,
            "run_id": report.run_id,
        }
        with self._tx(write=True) as conn:
            conn.execute(
                self._insert(drift_reports)
                .values(
                    project=report.project,
                    workspace=report.workspace,
                    checked_at=report.checked_at.astimezone(UTC),
                    **values,
                )
                .on_conflict_do_update(
                    index_elements=["project", "workspace", "checked_at"], set_=values
                )
            )

    def drift_reports(self, stack: StackRef, limit: int = 1) -> builtins.list[DriftReport]:
        """The newest ``limit`` drift reports of a stack, newest first."""
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(drift_reports)
                .where(*self._where_stack(drift_reports, stack))
                .order_by(drift_reports.c.checked_at.desc())
                .limit(limit)
            ).all()
        reports = []
        for row in rows:
            summary = dict(row.summary or {})
            repair = summary.pop("repair_workflow_id", None)
            reports.append(
                DriftReport(
                    project=row.project,
                    workspace=row.workspace,
                    checked_at=as_utc(row.checked_at),
                    revision=row.revision,
                    drifted=bool(row.drifted),
                    summary=DriftSummary.model_validate(summary),
                    report_ref=row.report_ref,
                    workflow_id=row.workflow_id,
                    run_id=row.run_id,
                    repair_workflow_id=repair,
                )
            )
        return reports

    # ---- Terraform state -------------------------------------------------------------------

    def put_terraform_state(
        self,
        stack: StackRef,
        resource_id: str,
        body: str,
        *,
        revision: int,
        run: RunRef | None,
    ) -> None:
        """Keep the resource's newest OpenTofu state (fenced on ``run``); an older serial of
        the same lineage never replaces a newer one."""
        self.put_terraform_states(stack, {resource_id: body}, revision=revision, run=run)

    def put_terraform_states(
        self,
        stack: StackRef,
        bodies: Mapping[str, str],
        *,
        revision: int,
        run: RunRef | None,
    ) -> None:
        """:meth:`put_terraform_state` for several resources in one transaction (what one
        tofu command changed is kept all at once or not at all): per chunk of :data:`CHUNK`
        resources, one read of the serials kept and one upsert statement for its rows."""
        t = terraform_states.c
        docs = {rid: json.loads(body) for rid, body in bodies.items()}
        ids = builtins.list(docs)
        with self._tx(write=True) as conn:
            self._fence(conn, stack, revision, run, share=True)
            for begin in range(0, len(ids), CHUNK):
                chunk = ids[begin : begin + CHUNK]
                query = sa.select(t.resource_id, t.serial, t.lineage).where(
                    *self._where_stack(terraform_states, stack), t.resource_id.in_(chunk)
                )
                kept = {row.resource_id: row for row in conn.execute(query)}
                rows = []
                for rid in chunk:
                    doc = docs[rid]
                    serial, lineage = int(doc.get("serial", 0)), str(doc.get("lineage", ""))
                    row = kept.get(rid)
                    if row is not None and row.lineage == lineage and row.serial > serial:
                        continue  # an older serial of the same lineage never replaces a newer
                    rows.append(
                        {
                            "project": stack.project,
                            "workspace": stack.workspace,
                            "resource_id": rid,
                            "body": self.sealer.seal_text(
                                bodies[rid], stack.project, stack.workspace, rid, "tfstate"
                            ),
                            "serial": serial,
                            "lineage": lineage,
                            "revision": revision,
                            "run_id": run.run_id if run else None,
                            "updated_at": now(),
                        }
                    )
                if not rows:
                    continue
                upsert = self._insert(terraform_states)
                changed = ("body", "serial", "lineage", "revision", "run_id", "updated_at")
                conn.execute(
                    upsert.on_conflict_do_update(
                        index_elements=["project", "workspace", "resource_id"],
                        set_={name: upsert.excluded[name] for name in changed},
                    ),
                    rows,
                )

    def get_terraform_state(self, stack: StackRef, resource_id: str) -> str | None:
        return self.get_terraform_states(stack, [resource_id]).get(resource_id)

    def get_terraform_states(self, stack: StackRef, resource_ids: Iterable[str]) -> dict[str, str]:
        """The kept OpenTofu states of several resources, read in one transaction (a
        resource with none is left out)."""
        t = terraform_states.c
        wanted = builtins.list(dict.fromkeys(resource_ids))
        stored: dict[str, str] = {}
        with self._tx() as conn:
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start : start + CHUNK]
                query = sa.select(t.resource_id, t.body).where(
                    *self._where_stack(terraform_states, stack), t.resource_id.in_(chunk)
                )
                stored.update({row.resource_id: row.body for row in conn.execute(query)})
        return {
            rid: self.sealer.open_text(body, stack.project, stack.workspace, rid, "tfstate")
            for rid, body in stored.items()
        }

    def delete_terraform_state(
        self, stack: StackRef, resource_id: str, *, revision: int, run: RunRef | None
    ) -> None:
        with self._tx(write=True) as conn:
            self._fence(conn, stack, revision, run, share=True)
            conn.execute(
                terraform_states.delete().where(
                    *self._where_stack(terraform_states, stack),
                    terraform_states.c.resource_id == resource_id,
                )
            )

    # ---- saved plans ---------------------------------------------------------------------------

    def put_terraform_plan(self, stack: StackRef, revision: int, digest: str, plan: bytes) -> None:
        """Keep a plan file an apply's preview made for release ``revision`` (sealed as a state
        is: it holds the same values), by the digest of its inputs; plans kept for the stack's
        older releases are dropped (their applies are over)."""
        p = terraform_plans.c
        digest = self.sealer.keyed(digest, "tfplan")  # it covers the sensitive variables
        body = self.sealer.seal_text(
            base64.b64encode(plan).decode(),
            stack.project,
            stack.workspace,
            str(revision),
            digest,
            "tfplan",
        )
        with self._tx(write=True) as conn:
            conn.execute(
                terraform_plans.delete().where(
                    *self._where_stack(terraform_plans, stack), p.revision < revision
                )
            )
            upsert = self._insert(terraform_plans).values(
                project=stack.project,
                workspace=stack.workspace,
                revision=revision,
                digest=digest,
                body=body,
                created_at=now(),
            )
            conn.execute(
                upsert.on_conflict_do_update(
                    index_elements=["project", "workspace", "revision", "digest"],
                    set_={"body": upsert.excluded.body, "created_at": upsert.excluded.created_at},
                )
            )

    def take_terraform_plan(self, stack: StackRef, revision: int, digest: str) -> bytes | None:
        """The plan kept for release ``revision`` and these inputs, removed as it is read (a
        plan is applied once); None: none was kept."""
        p = terraform_plans.c
        digest = self.sealer.keyed(digest, "tfplan")
        where = (*self._where_stack(terraform_plans, stack), p.revision == revision)
        with self._tx(write=True) as conn:
            row = conn.execute(sa.select(p.body).where(*where, p.digest == digest)).first()
            if row is None:
                return None
            conn.execute(terraform_plans.delete().where(*where, p.digest == digest))
        text = self.sealer.open_text(
            row.body, stack.project, stack.workspace, str(revision), digest, "tfplan"
        )
        return base64.b64decode(text)
