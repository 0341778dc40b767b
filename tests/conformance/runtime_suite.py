"""The runtime conformance suite: what every runtime must do, run against each of them.

A runtime's test module subclasses :class:`RuntimeSuite` and provides a ``case`` fixture (a
:class:`RuntimeCase`: the runtime as the registry builds it from its entry point, the
options of a run, and four kinds of request). The suite then proves, the way the engine
calls a runtime (each call carries the state the last one returned as ``prior_state``):

- rules: the runtime is found through the ``stackflow.runtimes`` entry point, names its own
  type, and its id rule accepts the case's ids;
- read: a missing object reads as None;
- preview: a new object previews as a Create (through the engine's diff), and nothing is made;
- apply: the object exists afterwards and reads back as applied;
- idempotency: applying again changes nothing, and a preview then shows no change;
- update: a changed request previews as an Update and applies;
- delete: the object is gone, and deleting it again succeeds (a missing object is deleted);
- typed errors: bad attributes are ``InvalidInput`` (never retried);
- policy hook: ``check_policy`` refuses what the worker policy forbids with a
  ``PolicyViolation``, and a runtime that checks every call refuses it on apply too;
- calls made at once (as a group's or a preview batch's are): each keeps its own outcome,
  a bad one fails alone, and ``check_policies`` refuses the first refused request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from stackflow.engine.diff import Action, Change, diff_resource
from stackflow.engine.masking import sensitive_paths_for
from stackflow.model.runtime_rules import rules_for
from stackflow.runtimes.base import (
    Attributes,
    InvalidInput,
    ResourceRequest,
    Runtime,
    RuntimeOptions,
)
from stackflow.runtimes.policy import PolicyViolation
from stackflow.runtimes.registry import default_registry


@dataclass
class RuntimeCase:
    """What the suite needs of one runtime."""

    type_name: str
    options: RuntimeOptions
    make: Callable[[str], ResourceRequest]
    """A valid request for a new object named after the argument (unique per test)."""
    change: Callable[[ResourceRequest], ResourceRequest]
    """The same object with a desired change."""
    invalid: Callable[[str], ResourceRequest]
    """A request whose attributes can never succeed."""
    refused: Callable[[str], ResourceRequest]
    """A request the worker policy (as the case sets it up) refuses."""
    observed: Callable[[Attributes], Any]
    """The part of an object's live state that the requests set (to compare)."""
    runtime: Runtime | None = None
    """Built from the entry point by the suite."""


def with_prior(request: ResourceRequest, prior: Attributes | None) -> ResourceRequest:
    """The request as the engine sends it once the last release recorded ``prior``."""
    return request.model_copy(update={"prior_state": prior})


async def preview(case: RuntimeCase, request: ResourceRequest) -> Change:
    """What the preview activity does: read, preview, the engine's three-way diff."""
    runtime = case.runtime
    assert runtime is not None
    live, result = await runtime.observe(request, case.options, with_preview=True)
    assert result is not None
    sensitive = [*result.sensitive_paths, *sensitive_paths_for(request.type, request.attributes)]
    return diff_resource(
        request.id,
        request.type,
        result.would_be,
        live,
        request.prior_state,
        sensitive_paths=sensitive,
    )


class RuntimeSuite:
    """Subclass it as ``Test<Runtime>`` and give it a ``case`` fixture."""

    @pytest.fixture
    async def built(self, case: RuntimeCase) -> Any:
        registry = default_registry()
        case.runtime = registry.get(case.type_name)
        yield case
        await registry.close()

    async def test_found_through_its_entry_point(self, built: RuntimeCase) -> None:
        rules = rules_for(built.type_name)
        assert rules is not None, f"no stackflow.runtimes entry point declares {built.type_name}"
        assert built.runtime is not None and built.runtime.type_name == built.type_name
        request = built.make("rules")
        assert request.type == built.type_name
        assert rules.id_problem(request.id) is None

    async def test_read_of_a_missing_object_is_none(self, built: RuntimeCase) -> None:
        assert built.runtime is not None
        assert await built.runtime.read(built.make("missing"), built.options) is None

    async def test_lifecycle(self, built: RuntimeCase) -> None:
        """preview (Create, nothing made) → apply → read back → apply again (no change) →
        preview (UnChanged) → change (Update) → delete → delete again → read None."""
        runtime = built.runtime
        assert runtime is not None
        opts = built.options
        request = built.make("life")
        try:
            change = await preview(built, request)
            assert change.action is Action.Create, change
            assert await runtime.read(request, opts) is None, "a preview made the object"

            live = await runtime.apply(request, opts)
            read = await runtime.read(with_prior(request, live), opts)
            assert read is not None
            assert built.observed(read) == built.observed(live)

            again = await runtime.apply(with_prior(request, live), opts)
            assert built.observed(again) == built.observed(live), "apply is not idempotent"
            change = await preview(built, with_prior(request, again))
            assert change.action is Action.UnChanged, change

            updated = with_prior(built.change(request), again)
            change = await preview(built, updated)
            assert change.action is Action.Update, change
            live = await runtime.apply(updated, opts)
            assert built.observed(live) != built.observed(again)
            read = await runtime.read(with_prior(updated, live), opts)
            assert read is not None and built.observed(read) == built.observed(live)

            gone = with_prior(updated, live)
            await runtime.delete(gone, opts)
            assert await runtime.read(gone, opts) is None
            await runtime.delete(gone, opts)  # a missing object counts as deleted
        finally:
            await runtime.delete(request, opts)

    async def test_delete_of_a_missing_object_succeeds(self, built: RuntimeCase) -> None:
        assert built.runtime is not None
        await built.runtime.delete(built.make("never-made"), built.options)

    async def test_bad_attributes_are_invalid_input(self, built: RuntimeCase) -> None:
        runtime = built.runtime
        assert runtime is not None
        request = built.invalid("bad")
        with pytest.raises(InvalidInput) as err:
            await runtime.apply(request, built.options)
        assert not err.value.retryable
        assert await runtime.read(built.make("bad"), built.options) is None

    async def test_policy_hook_refuses(self, built: RuntimeCase) -> None:
        runtime = built.runtime
        assert runtime is not None
        request = built.refused("refused")
        with pytest.raises(PolicyViolation) as err:
            runtime.check_policy(request, built.options)
        assert err.value.resource_id == request.id and err.value.exit_code == 2
        runtime.check_policy(built.make("allowed"), built.options)
        if runtime.checks_every_call:
            with pytest.raises(PolicyViolation):
                await runtime.apply(request, built.options)

    async def test_calls_made_at_once_keep_their_own_outcomes(self, built: RuntimeCase) -> None:
        """As a group's calls (all at once for a runtime that coalesces them): three new
        objects and a bad request; each object applies, reads back and deletes on its own."""
        runtime = built.runtime
        assert runtime is not None
        opts = built.options
        requests = [built.make(f"at-once-{n}") for n in range(3)]
        try:
            results = await asyncio.gather(
                *(runtime.apply(r, opts) for r in [*requests, built.invalid("at-once-bad")]),
                return_exceptions=True,
            )
            assert isinstance(results[-1], InvalidInput), results[-1]
            lives = [live for live in results[:-1] if isinstance(live, dict)]
            assert len(lives) == len(requests), results
            reads = await asyncio.gather(
                *(
                    runtime.read(with_prior(r, live), opts)
                    for r, live in zip(requests, lives, strict=True)
                )
            )
            for live, read in zip(lives, reads, strict=True):
                assert read is not None and built.observed(read) == built.observed(live)
        finally:
            await asyncio.gather(*(runtime.delete(r, opts) for r in requests))
        assert await asyncio.gather(*(runtime.read(r, opts) for r in requests)) == [None] * 3
        first, second = built.refused("at-once-r1"), built.refused("at-once-r2")
        with pytest.raises(PolicyViolation) as err:
            runtime.check_policies([built.make("at-once-ok"), first, second], opts)
        assert err.value.resource_id == first.id
