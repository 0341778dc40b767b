"""--target / --exclude over a graph, and the walk's ETA."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from stackflow.core.errors import SpecError
from stackflow.engine.graph import Graph
from stackflow.engine.selection import LeftOutReason, Selection, check_patterns, select
from stackflow.workflows.walker import WalkProgress

# app-db <- app-web <- app-lb ; cache (alone) ; app-web also needs cache
GRAPH = Graph.from_dependencies(
    {"db": [], "cache": [], "web": ["db", "cache"], "lb": ["web"], "logs": []}
)


def test_everything_when_no_patterns() -> None:
    chosen = select(GRAPH, Selection())
    assert chosen.kept == set(GRAPH.ids) and chosen.left_out_count == 0


def test_target_keeps_the_match_and_what_it_depends_on() -> None:
    chosen = select(GRAPH, Selection(targets=["web"]))
    assert chosen.kept == {"web", "db", "cache"}
    assert {x.id: x.reason for x in chosen.left_out} == {
        "lb": LeftOutReason.not_targeted,
        "logs": LeftOutReason.not_targeted,
    }


def test_exclude_drops_the_match_and_its_dependents() -> None:
    chosen = select(GRAPH, Selection(excludes=["d?"]))
    assert chosen.kept == {"cache", "logs"}
    reasons = {x.id: (x.reason, x.via) for x in chosen.left_out}
    assert reasons["db"] == (LeftOutReason.excluded, None)
    assert reasons["web"] == (LeftOutReason.depends_on_excluded, "db")
    assert reasons["lb"] == (LeftOutReason.depends_on_excluded, "db")


def test_deleting_reverses_both_closures() -> None:
    # deleting web means deleting lb first; keeping web keeps what it depends on
    assert select(GRAPH, Selection(targets=["web"]), deleting=True).kept == {"web", "lb"}
    kept = select(GRAPH, Selection(excludes=["web"]), deleting=True)
    assert kept.kept == {"lb", "logs"}
    assert {x.id: x.reason for x in kept.left_out}["db"] == LeftOutReason.dependency_of_excluded


def test_target_and_exclude_together_and_repeated_patterns() -> None:
    chosen = select(GRAPH, Selection(targets=["lb", "logs"], excludes=["cache"]))
    assert chosen.kept == {"db", "logs"}


def test_a_pattern_matching_nothing_is_bad_input() -> None:
    with pytest.raises(SpecError, match="--target nope: matches no resource"):
        check_patterns(Selection(targets=["nope"]), GRAPH.ids)
    with pytest.raises(SpecError, match="--exclude: an empty pattern"):
        check_patterns(Selection(excludes=[""]), GRAPH.ids)
    check_patterns(Selection(targets=["*"], excludes=["l*"]), GRAPH.ids)


def test_eta_from_the_rate_of_finished_nodes() -> None:
    progress = WalkProgress()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert progress.eta_seconds(start, 10) is None  # not started
    progress.started = start
    assert progress.eta_seconds(start + timedelta(seconds=5), 10) is None  # nothing done yet
    progress.done = 4
    assert progress.eta_seconds(start + timedelta(seconds=8), 10) == pytest.approx(12.0)
    progress.done = 10
    assert progress.eta_seconds(start + timedelta(seconds=20), 10) == 0.0
