"""Every workflow a worker registers and a replayer replays, one module each."""

from __future__ import annotations

from stackflow.workflows.apply import ApplyWorkflow
from stackflow.workflows.batch import BatchWorkflow
from stackflow.workflows.destroy import DestroyWorkflow
from stackflow.workflows.drift import DriftWorkflow
from stackflow.workflows.notify import NotifyWorkflow
from stackflow.workflows.preview import PreviewWorkflow
from stackflow.workflows.refresh import RefreshWorkflow
from stackflow.workflows.rollback import RollbackWorkflow
from stackflow.workflows.stack_set import SetWorkflow

ALL_WORKFLOWS = [
    PreviewWorkflow,
    ApplyWorkflow,
    DestroyWorkflow,
    RollbackWorkflow,
    RefreshWorkflow,
    DriftWorkflow,
    BatchWorkflow,
    NotifyWorkflow,
    SetWorkflow,
]
