"""Calls started a few at a time, their results taken in call order (deterministic).

Preview batches of a run go this way: at most ``width`` in flight. Runs with the
``sliding-preview-window`` patch start the next call as soon as the oldest one's result is
taken; runs from before it start them in groups of ``width`` (the next group once the whole
group has ended), which left the workers idle while a group's slowest batch finished.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

C = TypeVar("C")
R = TypeVar("R")


async def in_order(
    calls: Sequence[C], start: Callable[[C], Awaitable[R]], width: int, *, sliding: bool
) -> AsyncIterator[tuple[C, R, bool]]:
    """Each call with its result, in call order; the flag is true where a group of the old
    (not sliding) order ends, and for every call when sliding. ``start`` starts a call at
    once (its activities are scheduled) and returns what to await for its result."""
    if not sliding:
        for first in range(0, len(calls), width):
            group = calls[first : first + width]
            started = [start(call) for call in group]
            for n, (call, pending) in enumerate(zip(group, started, strict=True)):
                yield call, await pending, n == len(group) - 1
        return
    flying = [(call, start(call)) for call in calls[:width]]
    following = iter(calls[width:])
    while flying:
        call, pending = flying.pop(0)
        result = await pending
        upcoming = next(following, None)
        if upcoming is not None:
            flying.append((upcoming, start(upcoming)))
        yield call, result, True
