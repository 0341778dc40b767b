"""The operation workflows, one module each; this module lists them for workers and
replayers and keeps the names older imports use."""

from __future__ import annotations

from workflows.apply import ApplyWorkflow
from workflows.batch import BatchWorkflow
from workflows.destroy import DestroyWorkflow
from workflows.drift import DriftWorkflow
from workflows.lines import PreviewLines, brief_changes, summarise
from workflows.nodes import Tally
from workflows.preview import PreviewWorkflow
from workflows.refresh import RefreshWorkflow
from workflows.rollback import RollbackWorkflow

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
