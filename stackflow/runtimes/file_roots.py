"""The worker's file roots: where a path a spec names on the worker may live. Only under
``STACKFLOW_ONPREM_ROOTS`` (none by default: refused until a root is configured), resolved
through symlinks, never stackflow's own state, keys, working directories, tools or code
(:func:`stackflow.runtimes.policy_paths.stackflow_paths`); files read at most
``STACKFLOW_ONPREM_MAX_BYTES`` (default 1 MiB). The OnPrem runtime's files and directories
and the files Terraform providers touch on the worker (``local_file``) are held to the same
roots through :func:`onprem_target`."""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy
from stackflow.runtimes.policy_paths import real_path, within


class OnPremTarget(BaseModel):
    """Where an OnPrem path lives once checked: its real parent directory ``parent``, the
    final component ``name``, and the directory ``anchor`` (a root, or a root's parent when
    the target is the root itself) to walk from without following symlinks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    anchor: str
    parent: str
    name: str

    @property
    def real(self) -> str:
        return os.path.join(self.parent, self.name)


@functools.lru_cache(maxsize=16)
def real_roots(roots: tuple[str, ...]) -> list[str]:
    """The configured roots, resolved once per worker (paths under them are resolved on
    every check)."""
    return [real_path(root) for root in roots]


def onprem_target(
    policy: WorkerPolicy,
    resource_id: str,
    path: str,
    *,
    field: str = "attributes.path",
    directory: bool = False,
    reading: bool = False,
    resolve: Callable[[str], str] = real_path,
) -> OnPremTarget:
    """Where ``path`` lives, once it is known to be inside a root (through symlinks) and
    outside stackflow's own paths; ``reading``: an existing file must not be too large.
    ``resolve`` resolves the parent directory (a batch passes one that remembers)."""
    roots = real_roots(tuple(policy.onprem.roots))
    if not roots:
        raise PolicyViolation(
            resource_id,
            field,
            f"{path}: this worker manages no files for specs (it has no STACKFLOW_ONPREM_ROOTS)",
        )
    lexical = os.path.normpath(path)
    parent = resolve(os.path.dirname(lexical))
    name = os.path.basename(lexical)
    if not name or name in (".", ".."):
        raise PolicyViolation(resource_id, field, f"{path} names no file or directory")
    via_parent = os.path.join(parent, name) if name else parent
    # realpath(path) is the resolved parent joined with the name unless the name itself
    # is a symlink: one lstat instead of resolving every component a second time
    real = real_path(lexical) if os.path.islink(via_parent) else via_parent
    for candidate in dict.fromkeys((via_parent, real)):
        if not any(within(candidate, root) for root in roots):
            resolved = f" (it resolves to {candidate})" if candidate != lexical else ""
            raise PolicyViolation(
                resource_id,
                field,
                f"{path} is outside this worker's OnPrem roots ({', '.join(roots)}){resolved}",
            )
        for protected in policy.protected:
            if candidate == protected.path:
                how = "is"
            elif within(candidate, protected.path):
                how = "is inside"
            elif directory and within(protected.path, candidate):
                how = "holds"
            else:
                continue
            raise PolicyViolation(
                resource_id,
                field,
                f"{path} {how} {protected.path}, {protected.reason}: no spec may touch it",
            )
    if reading:
        try:
            st = os.lstat(real)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode):
            check_size(policy, resource_id, field, st.st_size, f"the file at {path}")
    if via_parent in roots:  # the root itself: walk from the directory above it
        anchor = os.path.dirname(via_parent)
    else:
        anchor = next(root for root in roots if within(via_parent, root))
    return OnPremTarget(path=lexical, anchor=anchor, parent=parent, name=name)


def check_size(policy: WorkerPolicy, resource_id: str, field: str, size: int, what: str) -> None:
    limit = int(policy.onprem.max_bytes)
    if size > limit:
        raise PolicyViolation(
            resource_id,
            field,
            f"{what} is {size} bytes, over this worker's limit of {limit} bytes "
            "(STACKFLOW_ONPREM_MAX_BYTES)",
        )
