"""Patch checks of the workflows: one marker per run instead of one per patch.

Every ``workflow.patched`` call that returns true for the first time in a run records a
marker event *and* upserts the ``TemporalChangeVersion`` search attribute: an event pair and
a visibility write on the server, per patch, per run. A run of today's code reached six of
them before it changed anything.

Runs started since :data:`BASELINE` record that one marker instead: it stands for every
patch in :data:`BASELINED`, which all hold for such a run. Runs started before it have no
such marker, so ``workflow.patched(BASELINE)`` is false when they replay, and each of their
patches is asked as it was. The workflows ask through :func:`patched` only (a unit test
holds them to it), and it always asks the baseline before a patch it covers, so the
baseline is settled before any patch it stands for: a run cannot see a covered patch both
false (asked alone during replay) and true (through the baseline afterwards).

A new baseline keeps the earlier ones (:data:`EARLIER_BASELINES`): a patch is asked through
each baseline that covers it, newest first, so a run that recorded an earlier one replays
as it ran, and a new run records only the newest."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from stackflow.workflows.constants import BASELINE, BASELINED, EARLIER_BASELINES

BASELINES = ((BASELINE, BASELINED), *EARLIER_BASELINES)


def patched(patch_id: str) -> bool:
    """Whether this run takes the code path of ``patch_id`` (``workflow.patched``), through
    the baselines that cover ``patch_id``, newest first."""
    for baseline, covered in BASELINES:
        if patch_id in covered and workflow.patched(baseline):
            return True
    return workflow.patched(patch_id)
