"""Typed errors of the engine. Each carries the CLI exit code it maps to.

Exit codes: 0 ok, 1 operation failed, 2 bad input, 3 stack locked.
"""

from __future__ import annotations


class StackflowError(Exception):
    """Base of every error the engine raises on purpose; the message is one line for the user."""

    exit_code: int = 1


class SpecError(StackflowError):
    """The input (a spec, a release file, a path) is invalid."""

    exit_code = 2


class PolicyDenied(SpecError):
    """A policy refused the run's changes: a Rego policy of the policy gate, or a Kubernetes
    admission policy (ValidatingAdmissionPolicy or admission webhook) at a server-side
    dry-run. Exit 2, like any input the author has to change; its error type is
    ``PolicyDenied``."""


class GraphError(SpecError):
    """The resources do not form a valid DAG (duplicate/unknown ids, cycles)."""


class KusionFormatError(SpecError):
    """A Kusion release or metadata file cannot be read."""


class StoreError(StackflowError):
    """The state store failed or refused an operation."""


class NotFoundError(StoreError):
    """The record does not exist."""


class OperationFailed(StackflowError):
    """A run ended without succeeding, or a step on it was refused (exit 1)."""

    exit_code = 1


class ConflictError(StoreError):
    """The record exists already, or its version moved on (compare-and-swap failed)."""


class PhaseConflictError(ConflictError):
    """The release's phase forbids the change (a final phase is never left)."""


class FencedError(ConflictError):
    """A state write from a run that does not hold the stack (it was unlocked or recovered
    meanwhile): refused, nothing written."""


class StackLockedError(StackflowError):
    """The latest release of the stack is still in progress."""

    exit_code = 3


class SchemaError(StoreError):
    """The state backend's schema is missing or older than this stackflow needs."""

    exit_code = 2


class BackendUnavailableError(StoreError):
    """The state backend cannot be reached (retried by activities within a bound)."""
