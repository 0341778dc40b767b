"""How many event streams each caller may hold open on one API process (a stream over the
limit is a 429, not a slot taken from others)."""

from __future__ import annotations

from stackflow.api.problems import Problem

MAX_STREAMS = 8
"""Event streams one caller may hold open on one API process by default."""


MAX_STREAMS_ENV = "STACKFLOW_API_MAX_STREAMS"


class StreamSlot:
    """One open stream of ``who``; :meth:`release` (any number of times) frees it."""

    def __init__(self, slots: StreamSlots, who: str) -> None:
        self.slots, self.who, self.held = slots, who, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.release(self.who)


class StreamSlots:
    """The event streams each caller has open on this process (the event loop's own: no
    lock), at most ``limit`` each."""

    def __init__(self, limit: int = MAX_STREAMS) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def take(self, who: str) -> StreamSlot:
        """A slot for one more stream of ``who``; Problem 429 when it has ``limit`` open."""
        held = self.open.get(who, 0)
        if held >= self.limit:
            raise Problem(
                429,
                f"{who} already has {held} event streams open on this API server, the most "
                f"one caller may ({MAX_STREAMS_ENV}, stackflow serve "
                "--max-streams-per-caller): close one first, or read a run's events "
                "without following (?wait=false)",
                "too-many-streams",
                headers={"Retry-After": "5"},
            )
        self.open[who] = held + 1
        return StreamSlot(self, who)

    def release(self, who: str) -> None:
        left = self.open.get(who, 0) - 1
        if left > 0:
            self.open[who] = left
        else:
            self.open.pop(who, None)
