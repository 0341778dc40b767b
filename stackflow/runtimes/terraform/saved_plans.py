"""An apply applies the plan its preview showed, when nothing it was made from has changed.

An apply's preview (``options.preview_of``: the release the run will make) keeps the plan file
of each batch command in the state backend, sealed as a state is (it holds the same values),
under the release and the digest of what ``tofu plan`` read: the configuration, the sensitive
variables file, the merged state, the dependency lock file and the binary. That release's apply
of the same batch writes the same files, so it finds the plan by the same digest and runs
``tofu apply <plan>``: exactly what was previewed, without planning again. A plan is taken
(removed) as it is read; the release's unused ones go when it ends (the lock is freed). Any
other batch (other members, a value resolved only since the preview, a state changed, another
tofu) finds none and plans as before; a plan that fails to apply fails the batch as any
command does (its halves then plan again).

A delete's preview reads what it will delete with a refresh (``apply -refresh-only``). The
state that refresh wrote is kept the same way, under the digest of what the refresh read; the
release's delete of the same batch finds it and destroys from it with ``-refresh=false``:
what the preview showed, without refreshing every object again (as a saved plan is applied).
A delete that finds none refreshes, as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from pathlib import Path

from stackflow.core.refs import StackRef
from stackflow.runtimes.base import RuntimeOptions
from stackflow.runtimes.terraform.workdir import (
    CONFIG_FILE,
    PLAN_FILE,
    STATE_FILE,
    VARS_FILE,
    write_atomically,
)
from stackflow.state.protocols import TerraformStateStore

log = logging.getLogger(__name__)

LOCK_FILE_NAME = ".terraform.lock.hcl"
PLAN_LIMIT = 8 * 1024 * 1024
"""A larger plan file is not kept (its apply plans again)."""
INPUTS = (CONFIG_FILE, VARS_FILE, STATE_FILE, LOCK_FILE_NAME)
"""What a plan is made from, in the batch directory (a missing file counts as missing)."""


def inputs_digest(path: Path, binary: str) -> str:
    """The digest of what a command in ``path`` reads: equal digests, equal plans to apply."""
    digest = hashlib.sha256(binary.encode())
    for name in INPUTS:
        try:
            body = (path / name).read_bytes()
        except FileNotFoundError:
            digest.update(f"\0{name}:absent".encode())
            continue
        digest.update(f"\0{name}:{len(body)}:".encode())
        digest.update(body)
    return digest.hexdigest()


async def keep_plan(
    backend: TerraformStateStore, options: RuntimeOptions, path: Path, binary: str
) -> None:
    """After an apply's preview planned in ``path`` with ``binary``: its plan file, kept for
    the apply (nothing for another preview)."""
    if options.preview_of is None:
        return
    plan = (path / PLAN_FILE).read_bytes()
    if len(plan) > PLAN_LIMIT:
        return
    stack = StackRef(options.project, options.workspace)
    digest = inputs_digest(path, binary)
    await asyncio.to_thread(backend.put_terraform_plan, stack, options.preview_of, digest, plan)


async def take_plan(
    backend: TerraformStateStore, options: RuntimeOptions, path: Path, binary: str
) -> bool:
    """Before an apply in ``path`` with ``binary``: the plan its preview kept for these
    inputs, put in place as :data:`PLAN_FILE` (True), or none (False: it plans)."""
    if options.revision is None:
        return False
    stack = StackRef(options.project, options.workspace)
    digest = inputs_digest(path, binary)
    plan = await asyncio.to_thread(backend.take_terraform_plan, stack, options.revision, digest)
    if plan is None:
        return False
    (path / PLAN_FILE).unlink(missing_ok=True)
    fd = os.open(path / PLAN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:  # holds values: only this user reads it
        handle.write(plan)
    # (not the digest: it is taken over the sensitive variables)
    log.info(
        "%s/%s release %d: applying the plan its preview made (%d bytes)",
        options.project,
        options.workspace,
        options.revision,
        len(plan),
    )
    return True


REFRESHED = "refreshed-state"
"""What a kept refreshed state's digest starts with (a plan's is the bare digest)."""


async def keep_refreshed(
    backend: TerraformStateStore, options: RuntimeOptions, digest: str, path: Path
) -> None:
    """After a delete's preview refreshed in ``path``, whose inputs had ``digest`` before:
    the state the refresh wrote, kept for the release's delete (nothing for a preview that
    is not an apply's or a destroy's)."""
    if options.preview_of is None:
        return
    try:
        state = (path / STATE_FILE).read_bytes()
    except FileNotFoundError:
        return
    if len(state) > PLAN_LIMIT:
        return
    stack = StackRef(options.project, options.workspace)
    key = f"{REFRESHED}:{digest}"
    await asyncio.to_thread(backend.put_terraform_plan, stack, options.preview_of, key, state)


async def take_refreshed(
    backend: TerraformStateStore, options: RuntimeOptions, path: Path, binary: str
) -> bool:
    """Before a delete in ``path`` with ``binary``: the state its preview's refresh wrote
    from these inputs, put in place as the batch's state (True: it needs no refresh), or
    none (False: it refreshes)."""
    if options.revision is None:
        return False
    stack = StackRef(options.project, options.workspace)
    key = f"{REFRESHED}:{inputs_digest(path, binary)}"
    state = await asyncio.to_thread(backend.take_terraform_plan, stack, options.revision, key)
    if state is None:
        return False
    write_atomically(path / STATE_FILE, state.decode("utf-8"))
    log.info(
        "%s/%s release %d: destroying from the state its preview refreshed",
        options.project,
        options.workspace,
        options.revision,
    )
    return True
