"""Stack sets: loading a set file (the spec loader's budgets), the ``$stack.`` references of
a member's spec, the order of the set's stacks (``dependsOn`` and references are edges; a
cycle is refused with its path) and resolving references from recorded values.

Pure and deterministic; every error is one line naming the set file, the stack and what is
wrong (:class:`~stackflow.core.errors.SpecError`, exit 2)."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from fnmatch import fnmatchcase
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import ValidationError

from stackflow.core.errors import SpecError
from stackflow.core.paths import PathError, get_path, parse_path
from stackflow.engine.spec import SyntaxProblem, load_yaml
from stackflow.model.spec import Spec
from stackflow.model.stack_set import STACK_REF_PREFIX, StackReference, StackSet, Strategy

MAX_SET_BYTES = 1024 * 1024
"""A set file larger than this is refused before parsing."""
REFERENCE_LIMIT = 1000
"""``$stack.`` references one member's spec may hold."""
UNKNOWN_UNTIL_APPLY = "(known after apply)"
SET_READS = "_stackflow_set_reads"
"""A resolved spec's ``context`` key: the stacks its ``$stack.`` references read (a set's
destroy refuses to destroy a stack that a stack outside the set still reads)."""

IdsOf = Callable[[str], Container[str] | None]
"""A stack (``project/workspace``) -> its resource ids, or None when there is no such stack."""


def load_set_text(text: str | bytes, source: str) -> StackSet:
    """A set file's text as a :class:`StackSet`."""
    if len(text) > MAX_SET_BYTES:
        raise SpecError(f"{source}: {len(text)} bytes, the limit is {MAX_SET_BYTES} bytes")
    try:
        data = load_yaml(text)
    except SyntaxProblem as err:
        raise SpecError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{source}: invalid YAML{where}: {getattr(err, 'problem', err)}") from None
    return parse_set(data, source)


def parse_set(data: Any, source: str) -> StackSet:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a set is a mapping with 'name' and 'stacks'")
    try:
        return StackSet.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in first["loc"])
        where = where.replace(".[", "[")
        message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        message = message.removeprefix("Value error, ")
        raise SpecError(" ".join(f"{source}: {where or 'set'}: {message}".split())) from None


def load_set_file(path: str | Path) -> StackSet:
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as err:
        raise SpecError(f"{p}: cannot read: {err.strerror or err}") from None
    return load_set_text(text, str(p))


def reference_texts(value: Any) -> Iterator[str]:
    """Every string of ``value`` that is a ``$stack.`` reference (document order)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item.startswith(STACK_REF_PREFIX):
                yield item
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))


def split_reference(text: str, ids_of: IdsOf) -> StackReference:
    """``$stack.<project>/<workspace>.<resource id>.<field>`` split against the stacks
    ``ids_of`` knows: the first workspace that names a stack, then the longest resource id
    of it followed by a field."""
    rest = text[len(STACK_REF_PREFIX) :]
    project, slash, tail = rest.partition("/")
    if not slash or not project:
        raise SpecError(f"{text}: write $stack.<project>/<workspace>.<resource id>.<field>")
    cut = tail.find(".")
    while cut > 0:
        stack = f"{project}/{tail[:cut]}"
        ids = ids_of(stack)
        if ids is not None:
            return _split_id(text, stack, tail[cut + 1 :], ids)
        cut = tail.find(".", cut + 1)
    raise SpecError(f"{text}: names no stack (of the set, or with a release)")


def _split_id(text: str, stack: str, rest: str, ids: Container[str]) -> StackReference:
    cut = rest.rfind(".")
    while cut > 0:
        if rest[:cut] in ids:
            path = rest[cut + 1 :]
            try:
                parse_path(path)
            except PathError as err:
                raise SpecError(f"{text}: field {path!r}: {err}") from None
            return StackReference(stack, rest[:cut], path)
        cut = rest.rfind(".", 0, cut)
    if rest in ids:
        raise SpecError(f"{text}: name a field of {rest!r} after its id")
    raise SpecError(f"{text}: stack {stack} has no such resource")


def references(value: Any, ids_of: IdsOf, where: str) -> list[StackReference]:
    """The distinct ``$stack.`` references of ``value`` (a spec's resources), checked."""
    found: dict[str, StackReference] = {}
    for text in reference_texts(value):
        if text not in found:
            try:
                found[text] = split_reference(text, ids_of)
            except SpecError as err:
                raise SpecError(f"{where}: {err}") from None
            if len(found) > REFERENCE_LIMIT:
                raise SpecError(f"{where}: more than {REFERENCE_LIMIT} $stack. references")
    return list(found.values())


class SetOrder(NamedTuple):
    """The set's members in a dependency order and, for each, the members it follows."""

    order: list[int]
    deps: list[list[int]]


def order_members(
    names: Sequence[str], depends_on: Sequence[Sequence[str]], source: str
) -> SetOrder:
    """Members (``project/workspace``) in an order where each follows what it depends on;
    a dependency outside the set, or a cycle, is refused naming it."""
    index = {name: i for i, name in enumerate(names)}
    deps: list[list[int]] = []
    for name, wanted in zip(names, depends_on, strict=True):
        mine: set[int] = set()
        for other in wanted:
            if other not in index:
                raise SpecError(f"{source}: {name}: dependsOn {other}: not a stack of the set")
            if other == name:
                raise SpecError(f"{source}: {name}: depends on itself")
            mine.add(index[other])
        deps.append(sorted(mine))
    sorter = TopologicalSorter({i: deps[i] for i in range(len(names))})
    try:
        sorter.prepare()
    except CycleError as err:
        cycle = [names[i] for i in err.args[1]]
        raise SpecError(f"{source}: a cycle between stacks: {' -> '.join(cycle)}") from None
    order: list[int] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        order.extend(ready)
        sorter.done(*ready)
    return SetOrder(order, deps)


def reference_value(ref: StackReference, attributes: Mapping[str, Any] | None) -> Any:
    """The recorded value a reference names (``attributes``: the resource's recorded ones)."""
    if attributes is None:
        raise SpecError(f"{ref.text}: {ref.stack} has no recorded {ref.resource_id!r}")
    try:
        return get_path(attributes, parse_path(ref.path))
    except PathError as err:
        raise SpecError(f"{ref.text}: {ref.resource_id!r} of {ref.stack} has {err}") from None


def resolve(value: Any, values: Mapping[str, Any]) -> Any:
    """A copy of ``value`` with every whole-string ``$stack.`` reference replaced by
    ``values[text]`` (a reference not in it is left as it is)."""
    if isinstance(value, str):
        return values.get(value, value) if value.startswith(STACK_REF_PREFIX) else value
    if isinstance(value, Mapping):
        return {k: resolve(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(v, values) for v in value]
    return value


class MemberReads(NamedTuple):
    """What one member's references read: member index -> resource ids of it, and how many
    references its spec holds (to stacks outside the set too)."""

    upstream: dict[int, list[str]]
    references: int


def check_set(
    name: str,
    names: Sequence[str],
    specs: Sequence[Spec | None],
    declared: Sequence[Sequence[str]],
    recorded_ids: IdsOf,
) -> tuple[SetOrder, list[MemberReads]]:
    """A set's members checked as one: each spec's ``$stack.`` references (to a member's
    resources, or those a stack outside the set recorded: ``recorded_ids``), no reference
    to its own stack, and an order (references are dependencies too) without a cycle."""
    index = {stack: i for i, stack in enumerate(names)}
    known: dict[str, Container[str] | None] = {
        stack: None if spec is None else {r.id for r in spec.resources}
        for stack, spec in zip(names, specs, strict=True)
    }

    def ids_of(stack: str) -> Container[str] | None:
        if stack not in known:
            known[stack] = recorded_ids(stack)
        return known[stack]

    reads: list[MemberReads] = []
    depends: list[list[str]] = []
    for stack, spec, wanted in zip(names, specs, declared, strict=True):
        where = f"set {name}: {stack}"
        found = (
            []
            if spec is None
            else references([r.attributes for r in spec.resources], ids_of, where)
        )
        upstream: dict[int, list[str]] = {}
        for ref in found:
            if ref.stack == stack:
                raise SpecError(f"{where}: {ref.text}: reads its own stack (use $kusion_path)")
            if ref.stack in index:
                ids = upstream.setdefault(index[ref.stack], [])
                if ref.resource_id not in ids:
                    ids.append(ref.resource_id)
        reads.append(MemberReads(upstream, len(found)))
        depends.append([*wanted, *(names[i] for i in upstream)])
    return order_members(names, depends, f"set {name}"), reads


def wave_members(name: str, names: Sequence[str], strategy: Strategy) -> list[list[int]]:
    """Each wave's members (indices of ``names``, in the set's order): every stack in
    exactly one wave, every target pattern matching a stack."""
    wave_of: dict[int, int] = {}
    waves: list[list[int]] = []
    for w, wave in enumerate(strategy.waves):
        members: list[int] = []
        for pattern in wave.targets:
            matched = [i for i, stack in enumerate(names) if fnmatchcase(stack, pattern)]
            if not matched:
                raise SpecError(f"set {name}: strategy.waves[{w}]: {pattern!r} names no stack")
            for i in matched:
                if wave_of.get(i, w) != w:
                    raise SpecError(
                        f"set {name}: {names[i]} is in waves {wave_of[i]} and {w}: one wave each"
                    )
                wave_of[i] = w
                if i not in members:
                    members.append(i)
        waves.append(sorted(members))
    missing = [names[i] for i in range(len(names)) if i not in wave_of]
    if missing:
        raise SpecError(f"set {name}: {missing[0]} is in no wave of the strategy")
    return waves


def check_waves(
    name: str, names: Sequence[str], deps: Sequence[Sequence[int]], waves: Sequence[Sequence[int]]
) -> None:
    """No stack depends on a stack of a later wave."""
    wave_of = {i: w for w, members in enumerate(waves) for i in members}
    for i, mine in enumerate(deps):
        for d in mine:
            if wave_of[d] > wave_of[i]:
                raise SpecError(
                    f"set {name}: {names[i]} (wave {wave_of[i]}) depends on {names[d]}, "
                    f"of a later wave ({wave_of[d]})"
                )
