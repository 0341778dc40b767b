"""Loading and checking a Kusion v1 Spec (YAML or JSON, file or stdin) into the models of
:mod:`stackflow.model.spec`: a hardened loader with byte, nesting and alias budgets, and the
checks a valid shape does not make (known types, id conventions, sizes, a sound graph).

Every error is one line naming the source, the resource (index and id) and the field.
"""

from __future__ import annotations

import gc
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import ValidationError

from stackflow.core.errors import SpecError
from stackflow.engine.graph import build_graph, expand_id_references
from stackflow.model.runtime_rules import known_types, rules_for
from stackflow.model.spec import MAX_RESOURCE_BYTES, Resource, Spec, canonical_json

MAX_SPEC_BYTES = 512 * 1024 * 1024
"""A spec file larger than this is refused before parsing."""


MAX_NESTING = 512
"""Collections nested deeper than this are refused while parsing (libyaml's composer recurses
in C: some 30,000 levels crash the interpreter; real manifests stay under 100)."""


MAX_ALIASES = 10_000
"""YAML aliases (``*name``) one document may use."""


MAX_ALIAS_EXPANSION = 8 * 1024 * 1024
"""What aliases may add to a document once expanded, counting one per node plus each scalar's
length: an alias bomb of eight levels (700 bytes of text) would add 387 million nodes, a 1 MiB
string aliased a thousand times a gigabyte."""


_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster


_STR = "tag:yaml.org,2002:str"


_INT = "tag:yaml.org,2002:int"


_FLOAT = "tag:yaml.org,2002:float"


# Plain scalars are typed as kubectl's YAML (sigs.k8s.io/yaml over go-yaml v2) types them,
# where that differs from PyYAML's YAML 1.1:
#   - "=" is a string (PyYAML: the 1.1 'value' tag, which it cannot construct);
#   - no base 60: "22:22" and "1:20:30" are strings (PyYAML: the integers 1342 and 4830);
#   - numbers as Go parses them: 0o17 is an int; 1e3, 1.5E-2, 08 are floats (PyYAML: strings);
#   - timestamps stay strings (go-yaml v2 gives an untyped target a string too).
# One difference is kept on purpose: go-yaml v2 also reads y, Y, n, N as booleans, which
# turns a key such as `y:` into "true"; here they stay strings (as in Kusion's YAML 1.2).
_DIGITS = r"[0-9_]*[0-9][0-9_]*"


_INT_RE = re.compile(
    r"^[-+]?(?:0[bB]_*[01][01_]*|0[oO]_*[0-7][0-7_]*|0[xX]_*[0-9a-fA-F][0-9a-fA-F_]*"
    r"|0[0-7_]*|[1-9][0-9_]*)$"
)


_FLOAT_RE = re.compile(
    rf"^(?:[-+]?(?:_*\.{_DIGITS}|{_DIGITS}(?:\.[0-9_]*)?)(?:[eE][-+]?{_DIGITS})?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


_RETYPED = {_INT, _FLOAT, "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value"}


def _implicit_resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    table: dict[Any, list[tuple[str, re.Pattern[str]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _RETYPED]
        for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
    }
    # ints before floats: "10" matches both
    for tag, regexp, firsts in (
        (_INT, _INT_RE, "-+0123456789"),
        (_FLOAT, _FLOAT_RE, "-+0123456789."),
    ):
        for first in firsts:
            table.setdefault(first, []).append((tag, regexp))
    return {first: resolvers for first, resolvers in table.items() if resolvers}


class SyntaxProblem(yaml.YAMLError):
    """YAML or JSON text a parser accepts but kubectl would not; the message is one line."""


class DuplicateKeyError(SyntaxProblem):
    """A mapping names the same key twice (YAML or JSON); ``line`` is the second one's."""

    def __init__(self, key: Any, line: int, first_line: int | None = None) -> None:
        self.key = key
        self.line = line
        self.first_line = first_line
        first = f" (first at line {first_line})" if first_line is not None else ""
        super().__init__(f"line {line}: duplicate key {_show_key(key)}{first}")


def _show_key(key: Any) -> str:
    return json.dumps(key, ensure_ascii=False) if isinstance(key, str) else repr(key)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """Safe loader typing plain scalars as kubectl does (see above), refusing duplicate keys."""

    yaml_implicit_resolvers: ClassVar[dict[Any, Any]] = _implicit_resolvers()

    def construct_yaml_int(self, node: Any) -> int:
        text = node.value.replace("_", "")
        digits = text.lstrip("+-")
        sign = -1 if text.startswith("-") else 1
        if len(digits) > 1 and digits[0] == "0" and digits[1] in "01234567":
            return sign * int(digits, 8)  # YAML 1.1 octal, as Go reads it: 0755
        return sign * int(digits, 0)  # decimal, 0x, 0o, 0b

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        """As PyYAML's (``<<`` merge keys included), with two differences: a key given twice
        is an error, and plain string keys and values skip the generic constructor."""
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"expected a mapping node, but found {node.id}", node.start_mark
            )
        explicit = node.value
        self.flatten_mapping(node)  # drops the << pairs from ``explicit``, merged ones go first
        pairs = node.value
        merged = len(pairs) - len(explicit)
        mapping: dict[Any, Any] = {}
        if merged:  # a later merged mapping, then the explicit keys, override earlier ones
            for key_node, value_node in pairs[:merged]:
                mapping[self._key(node, key_node, deep)] = self.construct_object(value_node, deep)
        seen: dict[Any, Any] = {} if merged else mapping
        construct = self.construct_object
        for key_node, value_node in explicit:
            key = self._key(node, key_node, deep)
            if key in seen:
                raise self._duplicate(explicit, key, key_node, deep)
            if value_node.tag == _STR and type(value_node) is yaml.ScalarNode:
                value = value_node.value
            else:
                value = construct(value_node, deep)
            mapping[key] = value
            if merged:
                seen[key] = None
        return mapping

    def _key(self, node: Any, key_node: Any, deep: bool) -> Any:
        if key_node.tag == _STR and type(key_node) is yaml.ScalarNode:
            return key_node.value
        key = self.construct_object(key_node, deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "found unhashable key",
                key_node.start_mark,
            ) from None
        return key

    def _duplicate(
        self, pairs: list[tuple[Any, Any]], key: Any, key_node: Any, deep: bool
    ) -> DuplicateKeyError:
        first = next(k for k, _ in pairs if self._key(k, k, deep) == key)
        return DuplicateKeyError(key, key_node.start_mark.line + 1, first.start_mark.line + 1)


_Loader.add_constructor(_INT, _Loader.construct_yaml_int)


def check_id_convention(resource: Resource) -> str | None:
    """Why ``resource.id`` breaks the id convention its runtime declares, or None."""
    rules = rules_for(resource.type)
    return rules.id_problem(resource.id) if rules is not None else None


def unknown_type(type_name: str) -> str | None:
    """Why no runtime takes ``type_name``, or None."""
    if rules_for(type_name) is not None:
        return None
    known = known_types()
    expected = (
        f"{', '.join(known[:-1])} or {known[-1]}" if len(known) > 1 else "".join(known) or "none"
    )
    return f"unknown type {type_name!r}, expected {expected}"


def _non_finite(value: Any, at: str) -> str | None:
    """The path of the first NaN or Infinity in ``value`` (YAML ``.nan``/``.inf``, JSON
    ``NaN`` from lenient parsers): no JSON value, so no runtime or store could take it."""
    if isinstance(value, float) and not math.isfinite(value):
        return at
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, sub in items:
        found = _non_finite(sub, f"{at}[{key}]" if isinstance(key, int) else f"{at}.{key}")
        if found:
            return found
    return None


def _describe(data: Any, loc: tuple[int | str, ...]) -> str:
    """Turn a pydantic error location into ``resources[2] (id "x"): field.path``."""
    if len(loc) >= 2 and loc[0] == "resources" and isinstance(loc[1], int):
        index = loc[1]
        where = f"resources[{index}]"
        try:
            rid = data["resources"][index].get("id")
        except (AttributeError, IndexError, KeyError, TypeError):
            rid = None
        if isinstance(rid, str):
            where += f" (id {rid!r})"
        field = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in loc[2:])
        return f"{where}: {field.replace('.[', '[')}" if field else where
    return ".".join(str(p) for p in loc) or "<top level>"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _validation_message(data: Any, err: ValidationError) -> str:
    errors = err.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    msg = first["msg"]
    if len(loc) == 3 and loc[0] == "resources" and loc[-1] == "type" and first["type"] != "missing":
        got = first.get("input")
        msg = unknown_type(got if isinstance(got, str) else repr(got)) or msg
    elif first["type"] == "extra_forbidden":
        msg = "unknown field"
    text = f"{_describe(data, loc)}: {msg}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return _one_line(text)


def parse_spec(data: Any, source: str = "<input>") -> Spec:
    """Validate parsed YAML/JSON as a Spec whose resources form a valid DAG."""
    if not isinstance(data, dict):
        got = "nothing" if data is None else type(data).__name__
        raise SpecError(f"{source}: a spec is a mapping with a 'resources' list, got {got}")
    if "resources" not in data:
        raise SpecError(f"{source}: a spec needs a top-level 'resources' list")
    with gc_paused():
        return _validate(data, source)


def load_stored_spec(data: Any, source: str) -> Spec:
    """A spec the state backend stored (by content ref, hash checked): :func:`parse_spec`
    checked it (ids, types, sizes, the graph) before it was stored, so only its shape is
    validated again (and ids a runtime reads as references are written as such, as parsing
    does). A run given a stored spec by ref checks it whole once (:func:`check_spec`, in
    ``prepare_operation``); its other activities load it as is."""
    with gc_paused():
        try:
            spec = Spec.model_validate(data)
        except ValidationError as err:
            raise SpecError(f"{source}: {_validation_message(data, err)}") from err
        try:
            expand_id_references(spec)
        except SpecError as err:
            raise type(err)(f"{source}: {err}") from err
        return spec


def _validate(data: dict[str, Any], source: str) -> Spec:
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise SpecError(f"{source}: {_validation_message(data, err)}") from err
    check_spec(spec, source)
    return spec


def check_spec(spec: Spec, source: str) -> None:
    """What a valid shape does not say: known types, id conventions, sizes, a sound graph
    (resource ids listed where a runtime reads references written as ``$kusion_path``)."""
    for index, resource in enumerate(spec.resources):
        where = f"{source}: resources[{index}] (id {resource.id!r})"
        problem = unknown_type(resource.type)
        if problem:
            raise SpecError(f"{where}: type: {problem}")
        problem = check_id_convention(resource)
        if problem:
            raise SpecError(f"{where}: id: {problem}")
        try:
            size = len(canonical_json(resource.attributes, allow_nan=False))
            canonical_json(resource.extensions, allow_nan=False)
        except ValueError as err:  # NaN/Infinity (a recursive value is refused by the budget)
            bad = _non_finite(resource.attributes, "attributes") or _non_finite(
                resource.extensions, "extensions"
            )
            raise SpecError(
                f"{where}: {bad}: NaN and Infinity are not JSON values; quote it to pass a string"
                if bad
                else f"{where}: attributes: {err}"
            ) from None
        if size > MAX_RESOURCE_BYTES:
            raise SpecError(
                f"{where}: attributes: {size} bytes serialised, "
                f"the limit is {MAX_RESOURCE_BYTES} bytes per resource"
            )
    try:
        expand_id_references(spec)
        build_graph(spec)
    except SpecError as err:
        raise type(err)(f"{source}: {err}") from err


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building big acyclic trees.

    GC passes triggered by millions of fresh objects made large specs load in super-linear
    time (10,000 resources of YAML: 8.7 s with, 2.4 s without). Nothing built here has
    cycles, so nothing is leaked; the collector resumes (if it was on) afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _looks_like_json(text: str | bytes) -> bool:
    for char in text[:64] if isinstance(text, str) else text[:64].decode("latin-1"):
        if not char.isspace():
            return char == "{"
    return False


class _JsonDuplicate(Exception):
    pass


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _JsonDuplicate
    return obj


def _json_text(text: str | bytes) -> str:
    if isinstance(text, str):
        return text
    return text.decode(json.detect_encoding(text), "surrogatepass")


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _json_duplicate(text: str) -> DuplicateKeyError:
    """Where the first duplicate key of (valid) JSON text is: a walk that only tracks keys."""
    decoder = json.JSONDecoder()

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def skip(pos: int) -> int:
        return _JSON_SPACE.match(text, pos).end()  # type: ignore[union-attr]

    def value(pos: int) -> int:
        pos = skip(pos)
        char = text[pos]
        if char == "{":
            seen: dict[str, int] = {}
            pos = skip(pos + 1)
            while text[pos] != "}":
                key, end = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
                if key in seen:
                    raise DuplicateKeyError(key, line(pos), line(seen[key]))
                seen[key] = pos
                pos = skip(value(skip(end) + 1))  # past the ':' and the value
                if text[pos] == ",":
                    pos = skip(pos + 1)
            return pos + 1
        if char == "[":
            pos = skip(pos + 1)
            while text[pos] != "]":
                pos = skip(value(pos))
                if text[pos] == ",":
                    pos += 1
            return pos + 1
        _, end = decoder.raw_decode(text, pos)
        return int(end)

    try:
        value(0)
    except DuplicateKeyError as err:
        return err
    raise AssertionError("no duplicate key found")  # pragma: no cover - caller saw one


def _check_surrogates(text: str, data: Any) -> None:
    """JSON may escape half of a UTF-16 pair ("\\udcc3"): that is no character, refuse it."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        escape = f"\\u{ord(err.object[err.start]):04x}"
        pos = text.lower().find(escape)
        where = f" at line {text.count(chr(10), 0, pos) + 1}" if pos >= 0 else ""
        raise SyntaxProblem(
            f"invalid JSON{where}: {escape} is half of a UTF-16 surrogate pair, not a character"
        ) from None


def _may_escape_surrogates(text: str | bytes) -> bool:
    if isinstance(text, bytes):
        return b"\\ud" in text or b"\\uD" in text or b"\x00" in text[:4]  # or UTF-16/32
    return "\\ud" in text or "\\uD" in text


_SCALAR, _OPEN, _CLOSE, _ALIAS = range(4)


_EVENT_KINDS: dict[type, int] = {
    yaml.ScalarEvent: _SCALAR,
    yaml.SequenceStartEvent: _OPEN,
    yaml.MappingStartEvent: _OPEN,
    yaml.SequenceEndEvent: _CLOSE,
    yaml.MappingEndEvent: _CLOSE,
    yaml.AliasEvent: _ALIAS,
}


def _check_budget(text: str | bytes) -> None:
    """Refuse deep nesting and alias expansion from the event stream, before anything is built.

    Each collection's expanded size (one per node plus each scalar's length, aliases counted as
    what they stand for) is summed as its events stream by, so an alias bomb is refused after
    reading its few hundred bytes, not after expanding them; nesting is counted the same way.
    """
    open_sizes: list[int] = []
    open_anchors: list[str | None] = []
    anchors: dict[str, int] = {}
    aliases = added = 0
    kinds = _EVENT_KINDS
    events: Iterator[Any] = yaml.parse(text, Loader=_BaseLoader)
    for event in events:
        kind = kinds.get(type(event))
        if kind == _SCALAR:
            size, anchor = 1 + len(event.value), event.anchor
        elif kind == _OPEN:
            if len(open_sizes) >= MAX_NESTING:
                raise SyntaxProblem(
                    f"line {event.start_mark.line + 1}: collections nested deeper than "
                    f"{MAX_NESTING} levels"
                )
            open_sizes.append(1)
            open_anchors.append(event.anchor)
            continue
        elif kind == _CLOSE:
            size, anchor = open_sizes.pop(), open_anchors.pop()
        elif kind == _ALIAS:
            size, anchor = anchors.get(event.anchor, 1), None
            aliases += 1
            added += size
            if aliases > MAX_ALIASES or added > MAX_ALIAS_EXPANSION:
                what = (
                    f"more than {MAX_ALIASES} aliases"
                    if aliases > MAX_ALIASES
                    else f"aliases that expand to more than {MAX_ALIAS_EXPANSION // 2**20} MiB"
                )
                raise SyntaxProblem(
                    f"line {event.start_mark.line + 1}: excessive aliasing ({what}); "
                    "write the values out or nest fewer aliases"
                )
        else:
            continue
        if anchor is not None:
            anchors[anchor] = size
        if open_sizes:
            open_sizes[-1] += size


def load_yaml(text: str | bytes) -> Any:
    """Parse YAML (or JSON) safely, as kubectl reads it (see ``_Loader``).

    JSON takes a fast path. A key given twice in one mapping raises :class:`DuplicateKeyError`;
    nesting past ``MAX_NESTING`` and aliases past ``MAX_ALIASES``/``MAX_ALIAS_EXPANSION`` raise
    :class:`SyntaxProblem` before any value is built.
    """
    with gc_paused():
        if _looks_like_json(text):
            try:
                data = json.loads(text, object_pairs_hook=_json_object)
            except _JsonDuplicate:
                raise _json_duplicate(_json_text(text)) from None
            except RecursionError:
                raise SyntaxProblem("collections nested too deeply for JSON") from None
            except ValueError:
                pass  # not JSON after all: the YAML parser gives the better error
            else:
                if _may_escape_surrogates(text):
                    _check_surrogates(_json_text(text), data)
                return data
        _check_budget(text)
        return yaml.load(text, Loader=_Loader)


def parse_spec_text(text: str | bytes, source: str = "<input>") -> Spec:
    """Parse YAML (or JSON, a subset) text into a Spec."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: {len(text)} bytes, the limit is {MAX_SPEC_BYTES} bytes")
    try:
        data = load_yaml(text)
    except SyntaxProblem as err:
        raise SpecError(f"{source}: {err}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(_one_line(f"{source}: invalid YAML{where}: {problem}")) from err
    return parse_spec(data, source)


def load_spec(path: str | Path) -> Spec:
    """Load a spec from a file, or from stdin when ``path`` is ``-``."""
    if str(path) == "-":  # bytes: UTF-8 whatever the locale (an ASCII one would garble it)
        stdin = getattr(sys.stdin, "buffer", sys.stdin)
        return parse_spec_text(stdin.read(), "<stdin>")
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(f"{p}: {size} bytes, the limit is {MAX_SPEC_BYTES} bytes")
        text = p.read_bytes()
    except OSError as err:
        raise SpecError(f"{p}: cannot read: {err.strerror or err}") from err
    return parse_spec_text(text, str(p))
