"""What the engine asks of the OnPrem runtime."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from stackflow.engine.graph import KUSION_PATH_PREFIX
from stackflow.model.runtime_rules import Described, Grouping, RuntimeRules

TYPE_NAME = "OnPrem"


def _place(resource: Described) -> tuple[str, str, str] | None:
    """(host, normalised absolute path, kind) of an OnPrem File, Directory or Service (its
    unit file), else None."""
    if str(resource.type) != TYPE_NAME:
        return None
    attrs = resource.attributes
    path, kind, host = attrs.get("path"), attrs.get("kind"), attrs.get("host") or ""
    if kind not in ("File", "Directory", "Service") or not isinstance(path, str):
        return None
    if not isinstance(host, str):
        return None
    if not path.startswith("/") or path.startswith(KUSION_PATH_PREFIX):
        return None
    return (host if host not in ("localhost", "127.0.0.1") else "", posixpath.normpath(path), kind)


def containment(resources: Sequence[Described]) -> dict[str, list[str]]:
    """A File or Directory under a Directory of the same resources depends on the nearest
    such Directory: created after it, deleted before it (as people write them, with no
    ``dependsOn``)."""
    places = {r.id: place for r in resources if (place := _place(r)) is not None}
    directories = {
        (host, path): rid for rid, (host, path, kind) in places.items() if kind == "Directory"
    }
    edges: dict[str, list[str]] = {}
    if not directories:
        return edges
    for rid, (host, path, _) in places.items():
        parent = posixpath.dirname(path)
        while parent != path:
            holder = directories.get((host, parent))
            if holder is not None and holder != rid:
                edges[rid] = [holder]
                break
            path, parent = parent, posixpath.dirname(parent)
    return edges


class OnPremRules(RuntimeRules):
    """Any unique id; file content is not secret by name; a Service's ``restartOn`` lists the
    ids of resources it reads; nodes share activities."""

    type_name: ClassVar[str] = TYPE_NAME
    runtime: ClassVar[str] = "stackflow.runtimes.onprem.runtime:OnPremRuntime"
    policy_section: ClassVar[str | None] = "stackflow.runtimes.policy:OnPremPolicy"
    backend_argument: ClassVar[str | None] = "claims"
    id_reference_fields: ClassVar[tuple[str, ...]] = ("restartOn",)
    grouped: ClassVar[bool] = True
    grouping: ClassVar[Grouping] = Grouping(limit=128, rounds=32)
    """A group takes up to 32 nodes per call of its share of the concurrency (a run asked
    to go one call at a time still moves in steps of 32), 128 at most: its runtime runs the
    calls made at once as one batch (the runtime's ``BATCH_LIMIT``), one after another."""

    def implicit_dependencies(self, resources: Sequence[Described]) -> dict[str, list[str]]:
        return containment(resources)

    def place(self, attributes: Mapping[str, Any]) -> str | None:
        """The host's name (an alias, or an ``ssh://`` address's host), as the policy's host
        globs match it; None: this machine."""
        host = attributes.get("host")
        if not isinstance(host, str) or host in ("", "localhost", "127.0.0.1"):
            return None
        from stackflow.runtimes.onprem.hosts import parse_host  # the policy's, when needed

        try:
            return parse_host(host).name
        except ValueError:
            return None  # refused by the runtime's own check


RULES = OnPremRules()
