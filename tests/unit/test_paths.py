from __future__ import annotations

import pytest

from stackflow.core.paths import (
    PathError,
    format_path,
    get_path,
    matches_prefix,
    parse_path,
    pattern_below,
)


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        ("spec.ports[0].port", ["spec", "ports", 0, "port"]),
        ("a", ["a"]),
        (
            'metadata.labels["app.kubernetes.io/name"]',
            ["metadata", "labels", "app.kubernetes.io/name"],
        ),
        ("items.*.name", ["items", "*", "name"]),
        ("[3]", [3]),
    ],
)
def test_parse_and_format(text: str, segments: list[object]) -> None:
    assert parse_path(text) == segments
    assert format_path(parse_path(text)) == text


@pytest.mark.parametrize("bad", [".a", "a..b", "a[", "a[x]", "a]"])
def test_bad_paths(bad: str) -> None:
    with pytest.raises(PathError):
        parse_path(bad)


def test_wildcard_index() -> None:
    assert parse_path("items[*].name") == parse_path("items.*.name")


def test_get_path() -> None:
    value = {"a": [{"b": 1}, {"c": [5, 6]}]}
    assert get_path(value, ["a", 1, "c", 1]) == 6
    assert get_path(value, []) is value
    with pytest.raises(PathError, match=r"no field a\[2\]"):
        get_path(value, ["a", 2])
    with pytest.raises(PathError, match=r"no field a\.x"):
        get_path(value, ["a", "x"])


def test_prefix_matching() -> None:
    assert matches_prefix(["a"], ["a", "b"])
    assert matches_prefix(["a", "*"], ["a", 3, "c"])
    assert not matches_prefix(["a", "b"], ["a"])
    assert pattern_below(["a", "b", "c"], ["a"]) == ["b", "c"]
    assert pattern_below(["a"], ["a"]) is None
