"""The operation workflows, one module each; this module lists them for workers and
replayers and keeps the names older imports use."""

from __future__ import annotations

from stackflow.workflows.apply import ApplyWorkflow
from stackflow.workflows.batch import BatchWorkflow
from stackflow.workflows.destroy import DestroyWorkflow
from stackflow.workflows.drift import DriftWorkflow
from stackflow.workflows.lines import PreviewLines, brief_changes, summarise
from stackflow.workflows.nodes import Tally
from stackflow.workflows.preview import PreviewWorkflow
from stackflow.workflows.refresh import RefreshWorkflow
from stackflow.workflows.rollback import RollbackWorkflow

ALL_WORKFLOWS = [
    PreviewWorkflow,
    ApplyWorkflow,
    DestroyWorkflow,
    RollbackWorkflow,
    RefreshWorkflow,
    DriftWorkflow,
    BatchWorkflow,
]

__all__ = [
    "ALL_WORKFLOWS",
    "ApplyWorkflow",
    "BatchWorkflow",
    "DestroyWorkflow",
    "DriftWorkflow",
    "PreviewLines",
    "PreviewWorkflow",
    "RefreshWorkflow",
    "RollbackWorkflow",
    "Tally",
    "brief_changes",
    "summarise",
]
