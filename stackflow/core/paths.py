"""Dotted field paths with list indices: ``spec.ports[0].port``.

Keys that contain ``.``, ``[`` or ``]`` (e.g. Kubernetes labels) are written
``["app.kubernetes.io/name"]``.
``*`` as a segment matches any key or index (used by ignore/sensitive patterns).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

Segment = str | int

_TOKEN = re.compile(r'\[(\d+|\*)\]|\["((?:[^"\\]|\\.)*)"\]|\.?([^.\[\]]+)')


class PathError(ValueError):
    """A path cannot be parsed or does not exist in a value."""


def parse_path(path: str) -> list[Segment]:
    """Parse ``a.b[0]["x.y"]`` into ``["a", "b", 0, "x.y"]``."""
    segments: list[Segment] = []
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if m is None or m.end() == pos or (pos == 0 and path.startswith(".")):
            raise PathError(f"invalid path {path!r} at position {pos}")
        index, quoted, key = m.groups()
        if index is not None:
            segments.append("*" if index == "*" else int(index))
        elif quoted is not None:
            segments.append(json.loads(f'"{quoted}"'))
        else:
            segments.append(key)
        pos = m.end()
    return segments


def format_path(segments: Sequence[Segment]) -> str:
    """Inverse of :func:`parse_path`."""
    out: list[str] = []
    for seg in segments:
        if isinstance(seg, int):
            out.append(f"[{seg}]")
        elif seg == "" or any(c in seg for c in '.[]"\\'):
            out.append(f"[{json.dumps(seg)}]")
        else:
            out.append(f".{seg}" if out else seg)
    return "".join(out)


def get_path(value: Any, segments: Sequence[Segment]) -> Any:
    """The value at ``segments``; raises :class:`PathError` naming the first missing segment."""
    current = value
    for i, seg in enumerate(segments):
        if not _has(current, seg):
            raise PathError(f"no field {format_path(segments[: i + 1])}")
        current = current[seg]
    return current


def _has(value: Any, seg: Segment) -> bool:
    if isinstance(seg, int):
        return isinstance(value, list) and 0 <= seg < len(value)
    return isinstance(value, Mapping) and seg in value


def matches_prefix(pattern: Sequence[Segment], segments: Sequence[Segment]) -> bool:
    """True if ``pattern`` matches ``segments`` or one of its ancestors."""
    if len(pattern) > len(segments):
        return False
    return all(p == "*" or p == s for p, s in zip(pattern, segments, strict=False))


def pattern_below(pattern: Sequence[Segment], segments: Sequence[Segment]) -> list[Segment] | None:
    """If ``segments`` is a strict ancestor of what ``pattern`` matches, the rest of the pattern."""
    if len(pattern) <= len(segments):
        return None
    head = pattern[: len(segments)]
    if all(p == "*" or p == s for p, s in zip(head, segments, strict=True)):
        return list(pattern[len(segments) :])
    return None


def parse_patterns(paths: Iterable[str]) -> list[list[Segment]]:
    """The patterns of ``paths`` (deduplicated, sorted); a malformed one (a recorded path from
    an older release, say) cannot match anything and is left out."""
    out = []
    for path in sorted(set(paths)):
        try:
            out.append(parse_path(path))
        except PathError:
            continue
    return out


def touches(patterns: Sequence[Sequence[Segment]], segments: Sequence[Segment]) -> bool:
    """Whether the value at ``segments`` is matched by a pattern, lies inside a match, or (a
    whole object) contains one."""
    return any(
        matches_prefix(p, segments) or pattern_below(p, segments) is not None for p in patterns
    )


def leaves(value: Any, at: tuple[Segment, ...] = ()) -> Iterator[tuple[tuple[Segment, ...], Any]]:
    """(path, value) of every leaf of ``value``; empty containers are leaves."""
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            yield from leaves(v, (*at, k))
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from leaves(v, (*at, i))
    else:
        yield at, value
