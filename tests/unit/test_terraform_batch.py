"""Terraform batches without tofu: which calls join a batch, and how states merge and split."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from stackflow.core.refs import StackRef
from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.terraform.batch import (
    BATCH_LIMIT,
    Call,
    Coalescer,
    StateLoader,
    batch_key,
    leftovers,
    merge_states,
    split_states,
    write_members,
)
from stackflow.runtimes.terraform.config import parse_resource, render_module

OPTS = RuntimeOptions(project="p", workspace="w", revision=3)
RANDOM = "registry.terraform.io/hashicorp/random/3.6.0"


def request(name: str, provider: str = RANDOM, **meta: Any) -> ResourceRequest:
    ext: dict[str, Any] = {"provider": provider, "resourceType": "random_id"}
    if meta:
        ext["providerMeta"] = meta
    return ResourceRequest(
        id=f"hashicorp:random:random_id:{name}",
        type="Terraform",
        attributes={"byte_length": 8},
        extensions=ext,
    )


def call(name: str, verb: str = "apply", state: dict[str, Any] | None = None) -> Call:
    req = request(name)
    return Call(verb, req, OPTS, parse_resource(req), state)  # type: ignore[arg-type]


def state_of(name: str, lineage: str, serial: int, value: str) -> dict[str, Any]:
    return {
        "version": 4,
        "terraform_version": "1.12.6",
        "serial": serial,
        "lineage": lineage,
        "outputs": {},
        "resources": [
            {
                "mode": "managed",
                "type": "random_id",
                "name": name,
                "provider": 'provider["registry.terraform.io/hashicorp/random"]',
                "instances": [{"schema_version": 0, "attributes": {"id": value}}],
            }
        ],
    }


def test_each_member_gets_its_own_part_back_as_its_next_serial() -> None:
    a, b = state_of("a", "L-a", 7, "x"), state_of("b", "L-b", 2, "y")
    merged = merge_states([a, None, b])
    assert merged is not None and [r["name"] for r in merged["resources"]] == ["a", "b"]
    parts = split_states(merged, {"random_id.a": a, "random_id.c": None})
    part_a = parts["random_id.a"]
    assert (part_a["lineage"], part_a["serial"]) == ("L-a", 8)
    assert part_a["resources"] == a["resources"]
    new = parts["random_id.c"]  # created by the batch: a lineage of its own
    assert new["serial"] == 1 and new["lineage"] not in ("L-a", "L-b") and new["resources"] == []
    assert merge_states([None, None]) is None


def test_one_configuration_holds_every_member_and_one_provider_block() -> None:
    members = [parse_resource(request(n)) for n in ("a", "b")]
    doc = render_module(members, with_resources=True)
    assert set(doc["resource"]["random_id"]) == {"a", "b"}
    assert list(doc["provider"]) == ["random"]
    assert "resource" not in render_module(members, with_resources=False)


def test_calls_that_cannot_share_a_command_get_different_keys() -> None:
    same = batch_key(parse_resource(request("a")), OPTS)
    assert same == batch_key(parse_resource(request("b")), OPTS)
    other_meta = parse_resource(request("a", region="x"))
    other_stack = RuntimeOptions(project="q", workspace="w", revision=3)
    env = RuntimeOptions(project="p", workspace="w", revision=3, context={"env": {"K": "v"}})
    keys = {
        batch_key(other_meta, OPTS),
        batch_key(parse_resource(request("a")), other_stack),
        batch_key(parse_resource(request("a")), env),
    }
    assert same not in keys and len(keys) == 3


async def test_concurrent_calls_run_as_batches() -> None:
    seen: list[list[str]] = []

    async def run(batch: list[Call]) -> None:
        seen.append([c.res.name for c in batch])
        for c in batch:
            c.settle(c.res.name.upper())

    coalescer = Coalescer(run)
    results = await asyncio.gather(*(coalescer.submit("k", call(f"n{i}")) for i in range(5)))
    assert results == ["N0", "N1", "N2", "N3", "N4"] and seen == [[f"n{i}" for i in range(5)]]

    # a full batch starts at once; a repeated address starts the next batch
    seen.clear()
    await asyncio.gather(*(coalescer.submit("k", call(f"m{i}")) for i in range(BATCH_LIMIT + 1)))
    assert sorted(len(b) for b in seen) == [1, BATCH_LIMIT]
    seen.clear()
    await asyncio.gather(coalescer.submit("k", call("x")), coalescer.submit("k", call("x")))
    assert seen == [["x"], ["x"]]
    # verbs never mix
    seen.clear()
    await asyncio.gather(coalescer.submit("k", call("a")), coalescer.submit("k", call("b", "read")))
    assert sorted(seen) == [["a"], ["b"]]


async def test_a_batch_starts_once_calls_stop_coming_or_at_its_window() -> None:
    seen: list[list[str]] = []

    async def run(batch: list[Call]) -> None:
        seen.append([c.res.name for c in batch])
        for c in batch:
            c.settle(None)

    async def trickle(coalescer: Coalescer, names: list[str], gap: float) -> None:
        callers = []
        for name in names:
            callers.append(asyncio.ensure_future(coalescer.submit("k", call(name))))
            await asyncio.sleep(gap)
        await asyncio.gather(*callers)

    # calls that keep coming (each well within the quiet time of the last) share a batch,
    # which starts once they stop (long before its window); the next call starts another
    coalescer = Coalescer(run, window=30.0, quiet=0.5)
    await trickle(coalescer, ["a", "b", "c"], 0.02)
    await trickle(coalescer, ["d"], 0)
    assert seen == [["a", "b", "c"], ["d"]]

    # a quiet time longer than the window: the window still closes the batch
    seen.clear()
    coalescer = Coalescer(run, window=0.1, quiet=30.0)
    await trickle(coalescer, ["a", "b"], 0.5)
    assert seen == [["a"], ["b"]]


async def test_a_failing_or_forgetful_batch_answers_every_caller() -> None:
    async def boom(batch: list[Call]) -> None:
        raise ValueError("tofu went away")

    with pytest.raises(ValueError, match="went away"):
        await Coalescer(boom).submit("k", call("a"))

    async def forget(batch: list[Call]) -> None:
        batch[0].settle("done")

    results = await asyncio.gather(
        Coalescer(forget).submit("k", call("a")),
        Coalescer(forget).submit("k", call("b")),
        return_exceptions=True,
    )
    assert results == ["done", "done"]
    coalescer = Coalescer(forget)
    both = await asyncio.gather(
        coalescer.submit("k", call("a")), coalescer.submit("k", call("b")), return_exceptions=True
    )
    assert both[0] == "done" and "without a result" in str(both[1])


async def test_a_batch_stops_when_every_caller_gave_up() -> None:
    started = asyncio.Event()
    stopped: list[str] = []

    async def slow(batch: list[Call]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append(",".join(c.res.name for c in batch))
            raise
        for c in batch:
            c.settle("done")

    coalescer = Coalescer(slow)
    callers = [asyncio.ensure_future(coalescer.submit("k", call(n))) for n in ("a", "b")]
    await started.wait()
    callers[0].cancel()
    await asyncio.sleep(0.01)
    assert stopped == []  # b still waits for the command
    callers[1].cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    await asyncio.sleep(0.01)
    assert stopped == ["a,b"]

    # a caller that gives up inside the window: the batch never starts, the next call opens
    # a new one
    started.clear()
    gone = asyncio.ensure_future(coalescer.submit("k", call("c")))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    await asyncio.sleep(0.1)
    assert not started.is_set()
    after = asyncio.ensure_future(coalescer.submit("k", call("d")))
    await started.wait()
    after.cancel()
    await asyncio.gather(after, return_exceptions=True)
    await asyncio.sleep(0.01)
    assert stopped == ["a,b", "d"]


async def test_states_asked_for_together_are_read_together() -> None:
    reads: list[tuple[str, str, list[str]]] = []
    kept = {"a": "A", "b": "B", "bad": "B4D"}

    def fetch(stack: StackRef, ids: list[str]) -> dict[str, str]:
        reads.append((stack.project, stack.workspace, sorted(ids)))
        if "bad" in ids:
            raise ValueError("the state of bad does not open")
        return {i: kept[i] for i in ids if i in kept}

    loader = StateLoader(fetch)
    got = await asyncio.gather(
        *(loader.get(StackRef("p", "w"), i) for i in ("a", "b", "a", "none")),
        loader.get(StackRef("q", "w"), "a"),
    )
    assert got == ["A", "B", "A", None, "A"]
    assert sorted(reads) == [("p", "w", ["a", "b", "none"]), ("q", "w", ["a"])]

    # one state that cannot be read fails its own call only
    reads.clear()
    found = await asyncio.gather(
        loader.get(StackRef("p", "w"), "a"),
        loader.get(StackRef("p", "w"), "bad"),
        return_exceptions=True,
    )
    assert found[0] == "A" and "does not open" in str(found[1])
    assert reads == [("p", "w", ["a", "bad"]), ("p", "w", ["a"]), ("p", "w", ["bad"])]

    # a caller cancelled while waiting does not take the answer from another caller of the id
    first = asyncio.ensure_future(loader.get(StackRef("p", "w"), "b"))
    second = asyncio.ensure_future(loader.get(StackRef("p", "w"), "b"))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == "B" and first.cancelled()


def test_a_killed_batch_leaves_each_member_its_state(tmp_path: Path) -> None:
    before = state_of("a", "L-a", 4, "old")
    calls = [call("a", state=before), call("b")]
    workdirs = {c.res.id: tmp_path / c.res.name for c in calls}
    write_members(tmp_path, calls, workdirs)
    merged = merge_states([state_of("a", "X", 1, "new"), state_of("b", "Y", 1, "created")])
    (tmp_path / "terraform.tfstate").write_text(json.dumps(merged))
    found = {str(p.name): s for p, s in leftovers(tmp_path, "terraform.tfstate")}
    assert (found["a"]["lineage"], found["a"]["serial"]) == ("L-a", 5)
    assert found["a"]["resources"][0]["instances"][0]["attributes"]["id"] == "new"
    assert found["b"]["resources"][0]["instances"][0]["attributes"]["id"] == "created"
    assert leftovers(tmp_path / "none", "terraform.tfstate") == []
