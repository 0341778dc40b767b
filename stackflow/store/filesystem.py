"""Records as YAML files: ``<root>/<type>s/<namespace>/<id>.yaml`` (e.g. ``releases/p/w/3.yaml``).

Writes are atomic (see :mod:`stackflow.store.atomic`); read-modify-write runs under an
``fcntl.flock`` on ``<namespace dir>/.lock``, which excludes other processes and, since every
call opens its own descriptor, other threads too. Readers take no lock: they always see a
whole file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from stackflow.errors import StoreError
from stackflow.spec import load_yaml
from stackflow.store.atomic import append_line, atomic_write
from stackflow.store.base import Metadata, Record, RecordStore, check_names, id_sort_key

log = logging.getLogger(__name__)

_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_SUFFIX = ".yaml"
_JOURNAL = ".journal.jsonl"


def type_dir(type_: str) -> str:
    """``Release`` → ``releases``."""
    return f"{type_.lower()}s"


class FileRecordStore(RecordStore):
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    # ---- layout ---------------------------------------------------------------------------

    def namespace_dir(self, type_: str, namespace: str) -> Path:
        return self.root / type_dir(type_) / namespace

    def record_path(self, type_: str, namespace: str, rid: str) -> Path:
        return self.namespace_dir(type_, namespace) / f"{rid}{_SUFFIX}"

    def journal_path(self, type_: str, namespace: str, rid: str) -> Path:
        return self.namespace_dir(type_, namespace) / f"{rid}{_JOURNAL}"

    # ---- primitives -----------------------------------------------------------------------

    @contextmanager
    def _exclusive(self, type_: str, namespace: str) -> Iterator[None]:
        directory = self.namespace_dir(type_, namespace)
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _load(self, type_: str, namespace: str, rid: str) -> Record | None:
        path = self.record_path(type_, namespace, rid)
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Record.model_validate(load_yaml(text))
        except (yaml.YAMLError, ValidationError) as err:
            raise StoreError(f"{path}: not a valid record: {str(err).splitlines()[0]}") from err

    def _save(self, record: Record) -> None:
        m = record.metadata
        # metadata first, so that get_metadata() can stop reading at the top-level "spec:" line
        data = {"metadata": m.model_dump(mode="json"), "spec": record.spec}
        text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
        atomic_write(self.record_path(m.type, m.namespace, m.id), text.encode())

    def _remove(self, type_: str, namespace: str, rid: str) -> None:
        self.record_path(type_, namespace, rid).unlink(missing_ok=True)
        self.journal_path(type_, namespace, rid).unlink(missing_ok=True)

    def ids(self, type_: str, namespace: str) -> list[str]:
        check_names(type_, namespace)
        try:
            names = os.listdir(self.namespace_dir(type_, namespace))
        except FileNotFoundError:
            return []
        found = [n[: -len(_SUFFIX)] for n in names if n.endswith(_SUFFIX) and not n.startswith(".")]
        return sorted(found, key=id_sort_key)

    def get_metadata(self, type_: str, namespace: str, rid: str) -> Metadata:
        """Parse only the leading ``metadata:`` block of the file."""
        check_names(type_, namespace, rid)
        path = self.record_path(type_, namespace, rid)
        head: list[bytes] = []
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    if line.startswith(b"spec:"):
                        break
                    head.append(line)
        except FileNotFoundError:
            return super().get_metadata(type_, namespace, rid)  # raises NotFoundError
        try:
            return Metadata.model_validate(load_yaml(b"".join(head))["metadata"])
        except (yaml.YAMLError, ValidationError, KeyError, TypeError):
            return super().get_metadata(type_, namespace, rid)

    # ---- journal --------------------------------------------------------------------------

    def append_journal(
        self, type_: str, namespace: str, rid: str, entry: Mapping[str, Any]
    ) -> None:
        check_names(type_, namespace, rid)
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode()
        with self._exclusive(type_, namespace):
            append_line(self.journal_path(type_, namespace, rid), line)

    def read_journal(self, type_: str, namespace: str, rid: str) -> list[dict[str, Any]]:
        check_names(type_, namespace, rid)
        try:
            data = self.journal_path(type_, namespace, rid).read_bytes()
        except FileNotFoundError:
            return []
        entries = []
        for number, line in enumerate(data.splitlines(), 1):
            try:
                entry = json.loads(line)
            except ValueError:
                # only a write cut short by a crash produces this: the entry never happened
                log.warning(
                    "skipping torn journal line %d of %s/%s/%s", number, type_, namespace, rid
                )
                continue
            if isinstance(entry, dict):
                entries.append(entry)
        return entries

    def clear_journal(self, type_: str, namespace: str, rid: str) -> None:
        check_names(type_, namespace, rid)
        with self._exclusive(type_, namespace):
            self.journal_path(type_, namespace, rid).unlink(missing_ok=True)
