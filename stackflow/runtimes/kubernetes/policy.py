"""The Kubernetes runtime's part of the worker policy: kubeconfigs, contexts, plugins,
namespaces and kinds.

kubeconfig paths only from ``STACKFLOW_ALLOWED_KUBECONFIGS`` (files or directories; the
worker's own ``KUBECONFIG`` unless a project's section sets ``worker_kubeconfig: false``);
contexts from ``STACKFLOW_ALLOWED_KUBE_CONTEXTS`` when set; exec credential and auth-provider
plugins only with ``STACKFLOW_ALLOW_KUBE_EXEC=1`` (read from the file before the client
loads it); objects only in ``STACKFLOW_ALLOWED_KUBE_NAMESPACES`` and of
``STACKFLOW_ALLOWED_KUBE_KINDS`` when set (:func:`check_object`). The settings themselves
(and each project's narrower ones) are read by :mod:`stackflow.runtimes.policy`.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import threading
from collections.abc import Mapping
from typing import Any

import yaml

from stackflow.runtimes.policy import MIB, PolicyViolation, WorkerPolicy
from stackflow.runtimes.policy_paths import real_path, split_list, within

KUBECONFIG_MAX_BYTES = 4 * MIB
"""A kubeconfig larger than this is not read (nor loaded)."""


def check_kubeconfig(
    policy: WorkerPolicy,
    resource_id: str,
    kubeconfig: str | None,
    context: str | None,
    *,
    config_field: str,
    context_field: str,
) -> None:
    """Refuse a kubeconfig (a path or ``os.pathsep`` list; None: the worker's own) or a
    context the policy forbids, and kubeconfigs whose user runs a plugin.

    A verdict that passed for the worker's own kubeconfig is kept for the same policy and
    context while its files are the same files, unchanged (one ``lstat`` each): every
    resource of a run is checked, and they almost always use the worker's kubeconfig."""
    memo = (kubeconfig, context)
    with _kube_lock:
        passed = None if kubeconfig else _passed.get(memo)
    if passed is not None and passed[0] is policy and passed[1] == _identities(passed[2]):
        return
    files = _check_kubeconfig(
        policy,
        resource_id,
        kubeconfig,
        context,
        config_field=config_field,
        context_field=context_field,
    )
    if kubeconfig:
        return  # a path the spec names is resolved again each time (a symlink may move)
    with _kube_lock:
        if len(_passed) > 64:
            _passed.clear()
        _passed[memo] = (policy, _identities(files), files)


def _identities(files: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    """Each file as it is now: (inode, mtime, size), None if absent or unreadable."""
    found: list[tuple[int, int, int] | None] = []
    for path in files:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            found.append(None)
            continue
        found.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(found)


def _check_kubeconfig(
    policy: WorkerPolicy,
    resource_id: str,
    kubeconfig: str | None,
    context: str | None,
    *,
    config_field: str,
    context_field: str,
) -> tuple[str, ...]:
    """:func:`check_kubeconfig` itself; the (real) files it read."""
    kube = policy.kubernetes
    if kubeconfig:
        files = []
        for entry in split_list(kubeconfig, os.pathsep):
            real = real_path(entry)
            if not kubeconfig_allowed(policy, real):
                raise PolicyViolation(
                    resource_id,
                    config_field,
                    f"{entry} is not a kubeconfig this worker allows "
                    "(STACKFLOW_ALLOWED_KUBECONFIGS)",
                )
            files.append(real)
        field = config_field
    else:
        if not kube.worker_kubeconfig:
            raise PolicyViolation(
                resource_id,
                config_field,
                "names no kubeconfig, and this project may not use the worker's own: name "
                "one its section allows (extensions.kubeConfig or context.kubeConfig)",
            )
        files = list(policy.worker_kubeconfigs)
        field = "the worker's KUBECONFIG"
    read = tuple(files)
    if kube.allow_exec and kube.allowed_contexts is None:
        return read  # nothing to look for in the files
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        doc = _kubeconfig_doc(resource_id, field, path)
        if doc is not None:
            docs.append((path, doc))
    if not docs:
        if context and kube.allowed_contexts is not None:
            check_context(policy, resource_id, context_field, context)
        return read  # no file: in-cluster, or the client reports the missing file
    chosen = context or next(
        (str(c["current-context"]) for _, c in docs if c.get("current-context")), None
    )
    if kube.allowed_contexts is not None:
        if chosen is None:
            raise PolicyViolation(
                resource_id,
                context_field,
                "no context is named and the kubeconfig has no current-context; this "
                "worker allows only named contexts (STACKFLOW_ALLOWED_KUBE_CONTEXTS)",
            )
        check_context(policy, resource_id, context_field if context else field, chosen)
    if kube.allow_exec:
        return read
    users = {
        str((entry.get("context") or {}).get("user"))
        for _, config in docs
        for entry in _named(config, "contexts")
        if chosen is None or entry.get("name") == chosen
    }
    for path, config in docs:
        for item in _named(config, "users"):
            if str(item.get("name")) not in users:
                continue
            found = item.get("user")
            user: dict[str, Any] = found if isinstance(found, dict) else {}
            for key, what in (("exec", "an exec credential plugin"), ("auth-provider", "")):
                if user.get(key):
                    plugin = what or f"the {_provider_name(user[key])} auth-provider plugin"
                    raise PolicyViolation(
                        resource_id,
                        field,
                        f"user {item.get('name')!r} in {path} runs {plugin}; this "
                        "worker does not allow kubeconfig plugins "
                        "(STACKFLOW_ALLOW_KUBE_EXEC)",
                    )
    return read


def kubeconfig_allowed(policy: WorkerPolicy, real: str) -> bool:
    if real in policy.worker_kubeconfigs and policy.kubernetes.worker_kubeconfig:
        return True
    for entry in policy.kubernetes.allowed_kubeconfigs:
        allowed = real_path(entry)
        if real == allowed or (os.path.isdir(allowed) and within(real, allowed)):
            return True
    return False


def check_context(policy: WorkerPolicy, resource_id: str, field: str, context: str) -> None:
    allowed = policy.kubernetes.allowed_contexts or ()
    if not any(fnmatch.fnmatchcase(context, pattern) for pattern in allowed):
        raise PolicyViolation(
            resource_id,
            field,
            f"context {context!r} is not one this worker allows "
            f"(STACKFLOW_ALLOWED_KUBE_CONTEXTS: {', '.join(allowed) or 'none'})",
        )


CORE_GROUP = "core"
"""How ``allowed_kinds`` names the core API group (``core/Secret``)."""


def check_object(policy: WorkerPolicy, resource_id: str, attributes: Mapping[str, Any]) -> None:
    """Refuse an object outside the policy's namespaces or kinds. A manifest of the wrong
    shape passes here: the runtime refuses it before any request (``object_ref``)."""
    kube = policy.kubernetes
    if kube.allowed_namespaces is None and kube.allowed_kinds is None:
        return
    api_version, kind = attributes.get("apiVersion"), attributes.get("kind")
    metadata = attributes.get("metadata")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return
    meta: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}
    kinds = kube.allowed_kinds
    if kinds is not None:
        group = api_version.rpartition("/")[0] or CORE_GROUP
        if not any(
            fnmatch.fnmatchcase(f"{group}/{kind}" if "/" in pattern else kind, pattern)
            for pattern in kinds
        ):
            raise PolicyViolation(
                resource_id,
                "attributes.kind",
                f"{group}/{kind} is not a kind this project may manage (allowed_kinds: "
                f"{', '.join(kinds) or 'none'})",
            )
    allowed = kube.allowed_namespaces
    if allowed is None:
        return
    namespace = meta.get("namespace")
    field = "attributes.metadata.namespace"
    if namespace is None and kind == "Namespace" and api_version == "v1":
        namespace, field = meta.get("name"), "attributes.metadata.name"
    if namespace is None:
        raise PolicyViolation(
            resource_id,
            field,
            f"a cluster-scoped {kind} (no namespace) is not something this project may "
            f"manage: it is confined to namespaces {', '.join(allowed) or 'none'} "
            "(allowed_namespaces)",
        )
    if not isinstance(namespace, str) or not any(
        fnmatch.fnmatchcase(namespace, pattern) for pattern in allowed
    ):
        raise PolicyViolation(
            resource_id,
            field,
            f"namespace {namespace!r} is not one this project may use (allowed_namespaces: "
            f"{', '.join(allowed) or 'none'})",
        )


def _named(doc: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    items = doc.get(key)
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _provider_name(value: Any) -> str:
    return str(value.get("name")) if isinstance(value, dict) else "?"


_kube_cache: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
_kube_lock = threading.Lock()
_passed: dict[
    tuple[str | None, str | None],
    tuple[WorkerPolicy, tuple[tuple[int, int, int] | None, ...], tuple[str, ...]],
] = {}
"""Verdicts that passed: (kubeconfig, context) → (the policy, its files as they were, the
files)."""


def _kubeconfig_doc(resource_id: str, field: str, path: str) -> dict[str, Any] | None:
    """A kubeconfig file's content (cached by identity and mtime); None if it does not exist
    (the client says so). Read without following a final symlink (``path`` is real)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise PolicyViolation(
            resource_id, field, f"cannot read the kubeconfig {path}: {exc.strerror}"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PolicyViolation(resource_id, field, f"{path} is not a regular file")
        if st.st_size > KUBECONFIG_MAX_BYTES:
            raise PolicyViolation(
                resource_id,
                field,
                f"the kubeconfig {path} is {st.st_size} bytes, more than a kubeconfig needs",
            )
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with _kube_lock:
            cached = _kube_cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(KUBECONFIG_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = " ".join(str(exc).split())[:200]
        raise PolicyViolation(
            resource_id, field, f"{path} cannot be read as a kubeconfig: {problem}"
        ) from None
    if not isinstance(doc, dict):
        raise PolicyViolation(resource_id, field, f"{path} is not a kubeconfig (not a mapping)")
    with _kube_lock:
        if len(_kube_cache) > 64:
            _kube_cache.clear()
        _kube_cache[path] = (key, doc)
    return doc
