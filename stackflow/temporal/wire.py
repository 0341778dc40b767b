"""Every compact encoding stackflow puts in Temporal history, in one place.

A run's history holds previews and walk batches of up to tens of thousands of resources, so
they travel as short codes rather than as the typed values the engine works with. This module
owns both directions; everything else speaks :class:`ActionCode`, :class:`ChangeFlags`,
:class:`LineRef` and :class:`DescribeItem`. The encodings are the wire format of runs in
flight: they never change (tests/unit/test_wire.py pins them).

- a **change code** (a preview batch's ``codes``): two characters per change, the action's
  letter (``C`` create, ``U`` update, ``D`` delete, ``N`` unchanged) and a digit of
  :class:`ChangeFlags` bits;
- a **batch action string** (a walk batch's ``actions``): one action letter per plan index
  from the batch's ``start``, ``.`` for an index the batch skips;
- a **describe item**: ``[kind, plan_index, action, flags, ref_index, ref_path]`` with kind ``n``
  (plan node) or ``d`` (plan deletion).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntFlag, StrEnum
from typing import NamedTuple

SKIPPED = "."
"""A plan index a walk batch does not run."""


class ActionCode(StrEnum):
    """One letter per action (``diff.Action``'s values are the action names)."""

    create = "C"
    update = "U"
    delete = "D"
    unchanged = "N"

    @property
    def action(self) -> str:
        """The action's name, as previews and releases show it (``Create``...)."""
        return _ACTIONS[self]

    @classmethod
    def of(cls, action: str) -> ActionCode:
        """The code of an action name (``Create``, ``Update``, ``Delete``, ``UnChanged``)."""
        return _CODES[action]


_ACTIONS = {
    ActionCode.create: "Create",
    ActionCode.update: "Update",
    ActionCode.delete: "Delete",
    ActionCode.unchanged: "UnChanged",
}
_CODES = {name: code for code, name in _ACTIONS.items()}


class ChangeFlags(IntFlag):
    """What a preview line says besides its action (one digit on the wire)."""

    none = 0
    drift = 1
    """Live moved away from the recorded state."""
    diff_omitted = 2
    """The change has a diff the batch did not return (past the first lines)."""
    unrecorded = 4
    """UnChanged, but this stack has not recorded it: the apply records it."""


NOT_MINE = "--"
"""A preview line another runtime's queue answers (a range split between runtimes)."""


def encode_change(action: str, flags: ChangeFlags) -> str:
    """One preview line's two characters."""
    return f"{ActionCode.of(action)}{int(flags)}"


def decode_changes(codes: str) -> list[tuple[ActionCode, ChangeFlags]]:
    """The lines of a preview batch's ``codes``."""
    return [(ActionCode(codes[i]), ChangeFlags(int(codes[i + 1]))) for i in range(0, len(codes), 2)]


class BatchActions:
    """A walk batch's ``actions``: the action of each plan index it runs, from ``start``."""

    @staticmethod
    def encode(picks: Iterable[tuple[int, str]]) -> tuple[int, str]:
        """``(start, actions)`` of ``(plan index, action name)`` pairs in ascending order."""
        chosen = list(picks)
        start = chosen[0][0]
        letters = [SKIPPED] * (chosen[-1][0] + 1 - start)
        for index, action in chosen:
            letters[index - start] = ActionCode.of(action)
        return start, "".join(letters)

    @staticmethod
    def decode(actions: str) -> list[tuple[int, ActionCode]]:
        """``(offset from start, code)`` of each index the batch runs."""
        return [(i, ActionCode(c)) for i, c in enumerate(actions) if c != SKIPPED]

    @staticmethod
    def indices(start: int, actions: str) -> list[int]:
        """The plan indices the batch runs."""
        return [start + i for i, c in enumerate(actions) if c != SKIPPED]

    @staticmethod
    def count(actions: str) -> int:
        """How many nodes the batch runs."""
        return len(actions) - actions.count(SKIPPED)


class LineRef(NamedTuple):
    """A preview line: a plan node or a plan deletion, by plan index."""

    deletion: bool
    plan_index: int

    @property
    def kind(self) -> str:
        """``n`` (node) or ``d`` (deletion), as describe items carry it."""
        return "d" if self.deletion else "n"


class DescribeItem(NamedTuple):
    """A preview line the run holds only as codes, for ``describe_changes``. On the wire a
    list: ``[kind, plan_index, action, flags, ref_index, ref_path]``."""

    kind: str
    plan_index: int
    action: str
    flags: int
    ref_index: int
    """The node whose planned change moves a referenced field, or -1."""
    ref_path: str

    @classmethod
    def of(
        cls, line: LineRef, action: str, flags: ChangeFlags, moved: tuple[int, str] | None
    ) -> DescribeItem:
        ref_index, ref_path = moved if moved is not None else (-1, "")
        return cls(line.kind, line.plan_index, action, int(flags), ref_index, ref_path)

    @property
    def line(self) -> LineRef:
        return LineRef(self.kind == "d", self.plan_index)
