"""Releases of stackflow before the state backend: ``<home>/releases/<p>/<w>/<n>.yaml``
records (``{metadata, spec: <release>}``) with an append-only ``<n>.journal.jsonl`` of
per-resource upserts and deletes. Read only, to import them (``stackflow state migrate
--from-dir``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stackflow.core.errors import KusionFormatError
from stackflow.engine.spec import load_yaml
from stackflow.model.release import Release, State
from stackflow.model.spec import Resource


def _fold(resources: list[Resource], journal: Path) -> list[Resource]:
    try:
        lines = journal.read_bytes().splitlines()
    except FileNotFoundError:
        return resources
    order = [r.id for r in resources]
    table = {r.id: r for r in resources}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn last line: that entry never happened
        if entry.get("op") == "upsert":
            resource = Resource.model_validate(entry["resource"])
            if resource.id not in table:
                order.append(resource.id)
            table[resource.id] = resource
        elif entry.get("op") == "delete":
            table.pop(str(entry.get("id")), None)
    return [table[rid] for rid in order if rid in table]


def read_legacy_home(home: Path) -> list[Release]:
    """Every release under ``home/releases``, journals folded, by stack and revision."""
    root = home / "releases"
    if not root.is_dir():
        raise KusionFormatError(f"{root}: no stackflow releases directory to migrate")
    found: list[Release] = []
    for path in sorted(root.glob("*/*/*.yaml")):
        if not path.stem.isdigit():
            continue
        try:
            record: Any = load_yaml(path.read_bytes())
            release = Release.model_validate(record["spec"])
        except (OSError, KeyError, TypeError, ValidationError, ValueError) as err:
            raise KusionFormatError(f"{path}: not a stackflow release record: {err}") from err
        if (release.project, release.workspace, str(release.revision)) != (
            path.parent.parent.name,
            path.parent.name,
            path.stem,
        ):
            raise KusionFormatError(
                f"{path}: holds {release.stack_ref} revision "
                f"{release.revision}, not what its path says"
            )
        release.state = State(
            resources=_fold(release.state.resources, path.with_name(f"{path.stem}.journal.jsonl"))
        )
        found.append(release)
    found.sort(key=lambda r: (r.project, r.workspace, r.revision))
    return found
