"""Preview batches a few at a time: results in call order either way; sliding, a call starts
as soon as the oldest result is taken, in groups only once the whole group has ended."""

from __future__ import annotations

import asyncio

from stackflow.workflows.windows import in_order


async def run(sliding: bool) -> tuple[list[str], list[tuple[int, int, bool]]]:
    log: list[str] = []
    gates = {n: asyncio.Event() for n in range(6)}

    def start(n: int) -> asyncio.Future[int]:
        log.append(f"start {n}")

        async def result() -> int:
            await gates[n].wait()
            return n * 10

        return asyncio.ensure_future(result())

    async def release() -> None:
        for n in (1, 0, 3, 2, 5, 4):  # out of order, as activities end
            await asyncio.sleep(0.01)
            log.append(f"end {n}")
            gates[n].set()

    ender = asyncio.ensure_future(release())
    seen = []
    async for call, result, checkpoint in in_order(list(range(6)), start, 4, sliding=sliding):
        log.append(f"took {call}")
        seen.append((call, result, checkpoint))
    await ender
    return log, seen


async def test_sliding_starts_the_next_call_once_the_oldest_result_is_taken() -> None:
    log, seen = await run(sliding=True)
    assert [call for call, _, _ in seen] == list(range(6))
    assert [result for _, result, _ in seen] == [0, 10, 20, 30, 40, 50]
    assert all(checkpoint for _, _, checkpoint in seen)
    # call 4 starts once call 0 has ended, before calls 2 and 3 have
    assert log.index("end 0") < log.index("start 4") < log.index("end 3") < log.index("end 2")


async def test_groups_start_the_next_group_once_the_whole_group_has_ended() -> None:
    log, seen = await run(sliding=False)
    assert [call for call, _, _ in seen] == list(range(6))
    assert [checkpoint for _, _, checkpoint in seen] == [False, False, False, True, False, True]
    assert log.index("end 2") < log.index("start 4")
    assert log.index("took 3") < log.index("start 4")
