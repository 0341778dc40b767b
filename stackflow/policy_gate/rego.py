"""What a bundle's Rego modules are, read as OPA reads them: each module's package (a
*policy* is a module in ``package stackflow``, a *library* any other package a policy of the
same bundle imports or refers to) and the ``data`` references each module makes.

Tokens follow OPA's scanner: whitespace is any run of space, tab, CR and LF (a CRLF file or
an indented ``package`` line is the same module as its LF, unindented copy), comments run
from ``#`` to the end of the line, strings are ``"…"`` (with escapes) or raw ```…```.
A package is a reference: ``stackflow.lib`` and ``stackflow["lib"]`` are the same package.

:func:`layout` refuses, naming the module, what cannot be judged as written: a module that
does not start with a package, a package in :data:`RESERVED` (the gate's own namespace, where
policies are evaluated: a module there would change another policy's rules), and a module
that is neither a policy nor a library a policy reaches (it would never be evaluated: a
silent pass), and METADATA annotations declaring ``schemas`` (OPA's compiler loads what
their ``$ref`` names, whatever the capabilities: a worker file, a URL)."""

from __future__ import annotations

import contextlib
import json
import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice

import yaml

POLICY_PACKAGE: tuple[str, ...] = ("stackflow",)
RESERVED = "stackflow_gate"
"""The namespace policies are evaluated in (``stackflow_gate.p<N>``): no module may name it."""
_FIX = (
    "a policy starts with `package stackflow`; a library (any other package) must be "
    "imported by a policy of the same bundle (e.g. `import data.stackflow.lib`)"
)

Path = tuple[str, ...]


@dataclass(frozen=True)
class Token:
    kind: str
    """``ident``, ``string`` (``text`` is its value), ``punct`` or ``other``."""
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class ModuleHead:
    """A module's package (and where its reference is written) and the ``data`` paths it
    refers to (imports and references in rules, as far as they are written statically)."""

    package: Path
    span: tuple[int, int]
    refs: tuple[Path, ...]

    @property
    def is_policy(self) -> bool:
        return self.package == POLICY_PACKAGE


class RegoLayoutError(ValueError):
    """A module the gate cannot judge as written (one line naming it)."""


_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+)
    | (?P<comment>\#[^\n]*)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"?)
    | (?P<raw>`[^`]*`?)
    | (?P<punct>[.\[\](){},;|])
    | (?P<other>.)
    """,
    re.X | re.S,
)


def tokens(source: str) -> Iterator[Token]:
    """The module's tokens, whitespace and comments left out (an unterminated string runs
    to the end of its line: OPA says where it is wrong)."""
    start = 1 if source.startswith("\ufeff") else 0  # OPA skips a byte-order mark first
    for match in _TOKEN.finditer(source, start):
        kind = match.lastgroup or "other"
        text = match.group()
        if kind in ("ws", "comment"):
            continue
        if kind == "string":
            with contextlib.suppress(ValueError):  # an escape OPA refuses: it says where
                text = str(json.loads(text))
        elif kind == "raw":
            kind, text = "string", text[1:].removesuffix("`")
        yield Token(kind, text, match.start(), match.end())


_DATA = re.compile(
    r"""
    "(?:[^"\\\n]|\\.)*"? | `[^`]*`? | \#[^\n]*
    | (?P<data>(?<![A-Za-z0-9_.])data(?![A-Za-z0-9_])
        (?:\.[A-Za-z_][A-Za-z0-9_]*
         | \[[ \t\r\n]*(?:"(?:[^"\\\n]|\\.)*"|`[^`]*`)[ \t\r\n]*\])*)
    """,
    re.X,
)


def _punct(tok: Token, text: str) -> bool:
    return tok.kind == "punct" and tok.text == text


def _segments(items: list[Token], end: int) -> tuple[list[str], int]:
    """The leading ``.ident`` / ``["string"]`` segments of ``items`` that continue a
    reference ending at offset ``end`` (OPA allows no whitespace before a ``.`` or a ``[``
    nor after a ``.``), and how many tokens they take."""
    path: list[str] = []
    i = 0
    while i < len(items) and items[i].start == end:
        if i + 1 < len(items) and _punct(items[i], ".") and items[i + 1].kind == "ident":
            if items[i + 1].start != items[i].end:
                break
            path.append(items[i + 1].text)
            end = items[i + 1].end
            i += 2
        elif (
            i + 2 < len(items)
            and _punct(items[i], "[")
            and items[i + 1].kind == "string"
            and _punct(items[i + 2], "]")
        ):
            path.append(items[i + 1].text)
            end = items[i + 2].end
            i += 3
        else:
            break
    return path, i


def head(source: str) -> ModuleHead:
    """The module's package and ``data`` references (RegoLayoutError: no package first)."""
    stream = tokens(source)
    first = list(islice(stream, 2))
    if len(first) < 2 or first[0].text != "package" or first[1].kind != "ident":
        raise RegoLayoutError("does not start with a package declaration (`package stackflow`)")
    package, end = [first[1].text], first[1].end
    ahead = list(islice(stream, 3))
    while True:  # the package reference's segments, three tokens of lookahead at a time
        more, used = _segments(ahead, end)
        if not used:
            break
        taken = 3 if _punct(ahead[0], "[") else 2
        package.append(more[0])
        end = ahead[taken - 1].end
        ahead = ahead[taken:] + list(islice(stream, taken))
    span = (first[1].start, end)
    refs = []
    for match in _DATA.finditer(source, end):
        if match.group("data"):
            found = list(tokens(match.group("data")))
            path, _ = _segments(found[1:], found[0].end)
            refs.append(tuple(path))
    return ModuleHead(package=tuple(package), span=span, refs=tuple(refs))


_COMMENT = re.compile(r"""(?:"(?:[^"\\\n]|\\.)*"?|`[^`]*`?)|\#(?P<text>[^\n]*)""")


def annotation_problem(source: str) -> str | None:
    """Why a module's METADATA annotations cannot be evaluated (None: they can). A
    ``schemas`` annotation makes OPA's compiler load every ``$ref`` it names, whatever the
    capabilities: a worker file (``file:///…``, its first bytes in the error) or a URL. A
    block is found as OPA finds one: a comment whose text starts with ``METADATA``, then the
    comments at the start of each following line."""
    blocks: list[tuple[int, list[str]]] = []
    rows = [0]  # offsets where rows start
    rows.extend(i + 1 for i, ch in enumerate(source) if ch == "\n")
    last_row = -2
    current: list[str] | None = None
    for match in _COMMENT.finditer(source):
        text = match.group("text")
        if text is None:
            continue
        row = bisect_right(rows, match.start()) - 1
        at_line_start = match.start() == rows[row]
        if current is not None and row == last_row + 1 and at_line_start:
            current.append(text.rstrip("\r"))
        elif text.strip().startswith("METADATA"):
            current = []
            blocks.append((row + 1, current))
        else:
            current = None
        last_row = row
    for row, lines in blocks:
        body = "\n".join(lines)
        try:
            parsed = yaml.safe_load(body)
        except yaml.YAMLError:
            return f"row {row}: a METADATA block that is not YAML"
        if (isinstance(parsed, dict) and "schemas" in parsed) or "schemas" in body.lower():
            return (
                f"row {row}: METADATA declares schemas, which OPA would load from the files "
                "or URLs they name: remove them (policies read the input document as is)"
            )
    return None


def _touches(ref: Path, package: Path) -> bool:
    """``ref`` reads (part of) ``package``: one is a prefix of the other."""
    shorter = min(len(ref), len(package))
    return ref[:shorter] == package[:shorter]


def dotted(path: Path) -> str:
    return ".".join(path)


def layout(modules: Mapping[str, str]) -> dict[str, ModuleHead]:
    """Every module's head, by its name; RegoLayoutError (one line, naming the module) for
    a module with no package first, a package in :data:`RESERVED`, or a library no policy
    of the bundle reaches (directly or through another library)."""
    heads: dict[str, ModuleHead] = {}
    for name, source in modules.items():
        try:
            found = head(source)
        except RegoLayoutError as exc:
            raise RegoLayoutError(f"{name}: {exc}") from None
        problem = annotation_problem(source)
        if problem is not None:
            raise RegoLayoutError(f"{name}: {problem}")
        if found.package[0] == RESERVED:
            raise RegoLayoutError(
                f"{name}: package {dotted(found.package)} is reserved for the policy gate "
                f"(no module may declare {RESERVED} or a package under it): {_FIX}"
            )
        heads[name] = found
    reached = {name for name, h in heads.items() if h.is_policy}
    frontier = list(reached)
    while frontier:
        refs = heads[frontier.pop()].refs
        for name, h in heads.items():
            if name not in reached and any(_touches(ref, h.package) for ref in refs):
                reached.add(name)
                frontier.append(name)
    for name, h in heads.items():
        if name not in reached:
            raise RegoLayoutError(
                f"{name}: package {dotted(h.package)} is not `package stackflow` and no "
                f"policy of this bundle imports it, so it would never be evaluated: {_FIX}"
            )
    return heads
