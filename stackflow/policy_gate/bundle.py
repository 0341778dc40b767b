"""A policy bundle: Rego modules by path, stored once under its sha256 in the state backend
(a project's pushed bundle and a run's own ``--policy DIR`` travel by that digest).

A bundle is checked as it is made (``policy push``, ``--policy DIR``, the API's bodies) and
again as it is read back: every module starts with a package, ``package stackflow`` makes
a module a policy, any other package is a library one of the bundle's policies imports, and
no module declares the gate's own namespace (:mod:`stackflow.policy_gate.rego`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stackflow.core.errors import SpecError
from stackflow.policy_gate.rego import layout

if TYPE_CHECKING:
    from stackflow.state.protocols import BlobStore

BUNDLE_KIND = "policy_bundle"
MAX_MODULES = 200
MAX_BUNDLE_BYTES = 1024 * 1024


class PolicyBundle(BaseModel):
    """Rego modules by their path in the bundle (``images.rego``, ``lib/k8s.rego``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    modules: dict[str, str] = Field(min_length=1, max_length=MAX_MODULES)

    @field_validator("modules")
    @classmethod
    def _paths_and_size(cls, modules: dict[str, str]) -> dict[str, str]:
        total = 0
        for path, source in modules.items():
            parts = path.split("/")
            if not path.endswith(".rego") or path.startswith("/") or ".." in parts or "" in parts:
                raise ValueError(f"{path!r} is not a relative path to a .rego file")
            if not path.isprintable() or len(path) > 200:
                # a module's path names its policy on terminals, in events and notifications
                raise ValueError(f"{path!r}: a module path of at most 200 printable characters")
            total += len(source.encode())
        if total > MAX_BUNDLE_BYTES:
            raise ValueError(f"the modules hold {total} bytes, more than {MAX_BUNDLE_BYTES}")
        ordered = dict(sorted(modules.items()))
        layout(ordered)  # RegoLayoutError (a ValueError) naming the module
        return ordered

    def to_bytes(self) -> bytes:
        return json.dumps({"modules": self.modules}, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.to_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, body: bytes) -> PolicyBundle:
        return cls.model_validate_json(body)


def load_bundle_dir(directory: str | os.PathLike[str]) -> PolicyBundle:
    """Every ``*.rego`` file under ``directory`` (``*_test.rego`` files, OPA's unit tests,
    left out). SpecError (exit 2) naming the path when the directory cannot be a bundle:
    missing, empty, a symlink, too many files or bytes, not UTF-8."""
    root = Path(directory)
    if not root.is_dir():
        raise SpecError(f"policy bundle {directory}: not a directory")
    modules: dict[str, str] = {}
    total = 0
    for path in sorted(root.rglob("*.rego")):
        rel = path.relative_to(root).as_posix()
        if path.name.endswith("_test.rego"):
            continue
        if path.is_symlink() or not path.is_file():
            raise SpecError(
                f"policy bundle {directory}: {rel}: not a regular file (symlinks are refused)"
            )
        if len(modules) >= MAX_MODULES:
            raise SpecError(f"policy bundle {directory}: more than {MAX_MODULES} modules")
        raw = path.read_bytes()
        total += len(raw)
        if total > MAX_BUNDLE_BYTES:
            raise SpecError(f"policy bundle {directory}: larger than {MAX_BUNDLE_BYTES} bytes")
        try:
            modules[rel] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError(f"policy bundle {directory}: {rel}: not UTF-8 text") from None
    if not modules:
        raise SpecError(
            f"policy bundle {directory}: no .rego files (write modules in package stackflow)"
        )
    try:
        return PolicyBundle(modules=modules)
    except ValueError as exc:  # a path or a module the bundle refuses: one line, exit 2
        raise SpecError(f"policy bundle {directory}: {problem_of(exc)}") from None


def problem_of(exc: ValueError) -> str:
    """One line for why modules are not a bundle (pydantic's first error, without the
    modules themselves)."""
    if isinstance(exc, ValidationError) and exc.errors():
        text = str(exc.errors()[0].get("msg", exc)).removeprefix("Value error, ")
    else:
        text = str(exc)
    return " ".join(text.split())[:500]


def store_bundle(blobs: BlobStore, bundle: PolicyBundle) -> str:
    """Store ``bundle`` (once: content-addressed); its digest."""
    return blobs.put_blob(BUNDLE_KIND, bundle.to_bytes())


def fetch_bundle(blobs: BlobStore, digest: str) -> PolicyBundle:
    """The bundle stored under ``digest``; SpecError when it is no longer one (stored before
    the module checks of :func:`~stackflow.policy_gate.rego.layout`): the run fails saying
    which module, never evaluates it as it stands."""
    body = blobs.get_blob(BUNDLE_KIND, digest)
    try:
        return PolicyBundle.from_bytes(body)
    except ValueError as exc:
        raise SpecError(f"policy bundle {digest}: {problem_of(exc)}") from None
