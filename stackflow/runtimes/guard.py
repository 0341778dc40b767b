"""The worker policy (:mod:`stackflow.runtimes.policy`) applied to many resources at once, before
any
runtime call: what the preview and apply activities call.

A spec previewed in several batches is checked whole by the first batch that runs on a
worker (the verdict is kept per spec and policy), and each batch checks its own resources
again right before touching them, so a refusal anywhere in a spec stops its preview before
any runtime call, and no resource ever reaches its runtime unchecked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from stackflow.core.ref_cache import RefCache
from stackflow.model.spec import Resource
from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.policy import WorkerPolicy, worker_policy
from stackflow.runtimes.registry import RuntimeRegistry

_CHECKED_SPECS = 64


def request_for(resource: Resource, attributes: dict[str, Any] | None = None) -> ResourceRequest:
    return ResourceRequest(
        id=resource.id,
        type=str(resource.type),
        attributes=resource.attributes if attributes is None else attributes,
        extensions=resource.extensions,
    )


def check_requests(
    registry: RuntimeRegistry, requests: Iterable[ResourceRequest], options: RuntimeOptions
) -> None:
    """Each resource's runtime checks it; the first refusal is raised (PolicyViolation). A
    worker for some runtimes checks the resources of its own (the others' workers check
    theirs before touching them)."""
    run: list[ResourceRequest] = []  # consecutive requests of one runtime, checked together
    for request in requests:
        if not registry.serves(request.type):
            continue
        if run and run[0].type != request.type:
            registry.get(run[0].type).check_policies(run, options)
            run = []
        run.append(request)
    if run:
        registry.get(run[0].type).check_policies(run, options)


class SpecGate:
    """Remembers the specs whose every resource passed the policy, per policy and project;
    one thread checks a spec, the preview batches that ask meanwhile wait for its word."""

    def __init__(self) -> None:
        self._passed: RefCache[tuple[str, str, WorkerPolicy], None] = RefCache(_CHECKED_SPECS)

    def check_spec(
        self,
        registry: RuntimeRegistry,
        spec_ref: str | None,
        resources: Mapping[str, Resource],
        options: RuntimeOptions,
    ) -> None:
        def check(_: object) -> None:
            check_requests(registry, (request_for(r) for r in resources.values()), options)

        if spec_ref is None:
            check(None)
            return
        # per project too: a project's section of the policy may narrow the worker's
        self._passed.get((spec_ref, options.project, worker_policy()), check)


SPECS = SpecGate()
"""This process's memo (the activities share it)."""


def check_preview(
    registry: RuntimeRegistry,
    spec_ref: str | None,
    resources: Mapping[str, Resource],
    batch: Iterable[Resource],
    options: RuntimeOptions,
) -> None:
    """A preview batch: the whole spec (once per spec and policy), then the batch's own
    resources (their deletions included) again, right before they are touched."""
    SPECS.check_spec(registry, spec_ref, resources, options)
    again = (r for r in batch if not registry.get(str(r.type)).checks_every_call)
    check_requests(registry, (request_for(r) for r in again), options)
