"""The worker policy: what a spec may make this worker do.

Spec authors write specs; whoever runs the worker decides what specs may do on it. The
policy is set on the worker - environment variables, optionally a YAML file named by
``STACKFLOW_POLICY_FILE`` (a variable that is set wins over the file) - and checked when a
resource is previewed (before any runtime call: no ``tofu init``, no file read, no
Kubernetes request), again before it is applied or deleted, and by the runtimes themselves
on every call. A violation is a :class:`PolicyViolation` (a :class:`SpecError`: exit 2, one
line naming the resource and the field).

This module owns only what is generic: the settings (one section per built-in runtime,
read from ``STACKFLOW_*`` variables and the policy file by :func:`load_policy`), the paths no
spec may touch (:func:`stackflow_paths`) and :class:`PolicyViolation`. Each runtime checks
its own part, in its own package: ``runtimes/terraform/policy.py`` (providers,
provisioners, ``context.env``), ``runtimes/kubernetes/policy.py`` (kubeconfigs, contexts,
plugins), ``runtimes/onprem/policy.py`` (roots and sizes), called from the runtime's
``check_policy`` (:class:`runtimes.base.Runtime`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import site
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, field_validator

from stackflow.errors import SpecError, StackflowError

MIB = 1024 * 1024
POLICY_FILE_VAR = "STACKFLOW_POLICY_FILE"
POLICY_FILE_MAX_BYTES = MIB

DEFAULT_TF_PROVIDERS = ("hashicorp/*",)
_ENV_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+$")


class PolicyViolation(SpecError):
    """The worker's policy refuses what a resource asks for."""

    def __init__(self, resource_id: str, field: str, problem: str) -> None:
        super().__init__(f"{resource_id}: {field}: {problem}")
        self.resource_id = resource_id
        self.field = field


class PolicyConfigError(StackflowError):
    """The worker's policy settings are invalid (a worker problem, not the spec's)."""


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def real_path(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def split_list(raw: str, sep: str) -> list[str]:
    return [item.strip() for item in raw.split(sep) if item.strip()]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _absolute(values: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for value in values:
        path = os.path.expanduser(value)
        if not os.path.isabs(path):
            raise ValueError(f"{value!r} is not an absolute path")
        out.append(os.path.normpath(path))
    return tuple(out)


class TerraformPolicy(_Section):
    allow_provisioners: bool = False
    """Trust Terraform specs to run programs on the worker (provisioners, connection
    blocks, code-running providers, exec blocks and file settings in provider configs)."""
    allowed_env: tuple[str, ...] = ()
    """``context.env`` names (or globs such as ``AWS_*``) specs may pass to the CLI."""
    pass_env: tuple[str, ...] = ()
    """Names (or globs) of the worker's own variables passed to the CLI (cloud credentials
    of the worker itself); never stackflow's, Temporal's or Redis's."""
    allowed_providers: tuple[str, ...] = DEFAULT_TF_PROVIDERS
    """Provider sources specs may use: ``namespace/name`` globs (the public registries) or
    ``host/namespace/name`` globs; ``*`` allows any."""

    @field_validator("allowed_env", "pass_env")
    @classmethod
    def _env_patterns(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not _ENV_PATTERN.match(value):
                raise ValueError(f"{value!r} is not a variable name or glob")
        return values

    @field_validator("allowed_providers")
    @classmethod
    def _provider_patterns(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            parts = value.strip("/").split("/")
            if not (value == "*" or len(parts) in (2, 3)) or not all(parts):
                raise ValueError(
                    f"{value!r} is not '*', '<namespace>/<name>' or '<host>/<namespace>/<name>'"
                )
        return tuple(v.strip("/").lower() for v in values)


class KubernetesPolicy(_Section):
    allowed_kubeconfigs: tuple[str, ...] = ()
    """kubeconfig files (or directories holding them) specs may name, besides the worker's
    own ``KUBECONFIG``."""
    allowed_contexts: tuple[str, ...] | None = None
    """Contexts (names or globs) specs may use; None: any context of an allowed file."""
    allow_exec: bool = False
    """Allow exec credential plugins and auth-provider plugins in the kubeconfigs used."""

    _paths = field_validator("allowed_kubeconfigs")(_absolute)


class OnPremPolicy(_Section):
    roots: tuple[str, ...] = ()
    """Directories OnPrem resources may live in; none: OnPrem is refused."""
    max_bytes: ByteSize = ByteSize(MIB)
    """Largest file content written or read."""
    protected: tuple[str, ...] = ()
    """More paths no spec may touch, on top of stackflow's own."""

    _paths = field_validator("roots", "protected")(_absolute)


class ApprovalPolicy(_Section):
    four_eyes: tuple[str, ...] = ()
    """Project globs whose runs the requester may not approve (``STACKFLOW_FOUR_EYES``):
    enforced by the run's ``approve`` Update validator, so for every client."""

    def four_eyes_for(self, project: str) -> bool:
        return any(fnmatch.fnmatchcase(project, glob) for glob in self.four_eyes)


class PolicySettings(_Section):
    """What the policy file (and the environment variables) set."""

    terraform: TerraformPolicy = Field(default_factory=TerraformPolicy)
    kubernetes: KubernetesPolicy = Field(default_factory=KubernetesPolicy)
    onprem: OnPremPolicy = Field(default_factory=OnPremPolicy)
    approvals: ApprovalPolicy = Field(default_factory=ApprovalPolicy)


class ProtectedPath(_Section):
    path: str
    reason: str


class WorkerPolicy(PolicySettings):
    """The settings plus what this worker keeps to itself (found by :func:`load_policy`)."""

    protected: tuple[ProtectedPath, ...] = ()
    worker_kubeconfigs: tuple[str, ...] = ()
    """The worker's own kubeconfig files (``KUBECONFIG``, else ~/.kube/config)."""
    source: str = "defaults"

    def summary(self) -> str:
        """One line for the worker's log."""
        tf, kube, onprem = self.terraform, self.kubernetes, self.onprem
        return (
            f"policy ({self.source}): provisioners {'allowed' if tf.allow_provisioners else 'no'}"
            f", providers {','.join(tf.allowed_providers)}"
            f", context.env {','.join(tf.allowed_env) or 'none'}"
            f", kubeconfigs {len(kube.allowed_kubeconfigs)} + the worker's"
            f", kube plugins {'allowed' if kube.allow_exec else 'no'}"
            f", OnPrem roots {':'.join(onprem.roots) or 'none'} (max {int(onprem.max_bytes)} B)"
            f", four-eyes {','.join(self.approvals.four_eyes) or 'none'}"
        )


# ---- loading ---------------------------------------------------------------------------------
_ENV_SETTINGS: dict[str, tuple[str, str, str]] = {
    "STACKFLOW_ALLOW_PROVISIONERS": ("terraform", "allow_provisioners", "bool"),
    "STACKFLOW_ALLOWED_ENV": ("terraform", "allowed_env", ","),
    "STACKFLOW_TF_PASS_ENV": ("terraform", "pass_env", ","),
    "STACKFLOW_ALLOWED_TF_PROVIDERS": ("terraform", "allowed_providers", ","),
    "STACKFLOW_ALLOWED_KUBECONFIGS": ("kubernetes", "allowed_kubeconfigs", os.pathsep),
    "STACKFLOW_ALLOWED_KUBE_CONTEXTS": ("kubernetes", "allowed_contexts", ","),
    "STACKFLOW_ALLOW_KUBE_EXEC": ("kubernetes", "allow_exec", "bool"),
    "STACKFLOW_ONPREM_ROOTS": ("onprem", "roots", os.pathsep),
    "STACKFLOW_ONPREM_MAX_BYTES": ("onprem", "max_bytes", "text"),
    "STACKFLOW_FOUR_EYES": ("approvals", "four_eyes", ","),
}
"""Environment variable -> (section, setting, how it is split)."""


def _read_policy_file(path: str) -> dict[str, Any]:
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            raw = handle.read(POLICY_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise PolicyConfigError(
            f"worker policy: {POLICY_FILE_VAR} {path}: {exc.strerror}"
        ) from None
    if len(raw) > POLICY_FILE_MAX_BYTES:
        raise PolicyConfigError(f"worker policy: {POLICY_FILE_VAR} {path}: larger than 1 MiB")
    try:
        doc = yaml.safe_load(raw.decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = " ".join(str(exc).split())[:300]
        raise PolicyConfigError(f"worker policy: {path}: {problem}") from None
    if not isinstance(doc, dict):
        raise PolicyConfigError(
            f"worker policy: {path}: expected a mapping with terraform, kubernetes, onprem"
        )
    return doc


def load_policy(environ: Mapping[str, str] | None = None) -> WorkerPolicy:
    """The policy the environment (and ``STACKFLOW_POLICY_FILE``) sets; a set variable wins
    over the file, an empty one counts as unset. PolicyConfigError names what is wrong."""
    env = os.environ if environ is None else environ
    file = env.get(POLICY_FILE_VAR) or None
    data: dict[str, Any] = _read_policy_file(file) if file else {}
    origin: dict[tuple[str, ...], str] = {}
    for var, (section, key, how) in _ENV_SETTINGS.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        block = data.get(section)
        if block is None:
            block = data[section] = {}
        if not isinstance(block, dict):
            raise PolicyConfigError(f"worker policy: {file}: {section} must be a mapping")
        block[key] = raw if how in ("bool", "text") else split_list(raw, how)
        origin[(section, key)] = var
    try:
        settings = PolicySettings.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(p) for p in err["loc"])
        where = origin.get(loc[:2]) or f"{file}: {'.'.join(loc)}"
        raise PolicyConfigError(f"worker policy: {where}: {err['msg']}") from None
    sources = [f"file {file}"] if file else []
    if origin:
        sources.append("environment")
    return WorkerPolicy(
        terraform=settings.terraform,
        kubernetes=settings.kubernetes,
        onprem=settings.onprem,
        approvals=settings.approvals,
        protected=tuple(stackflow_paths(env, settings)),
        worker_kubeconfigs=tuple(worker_kubeconfigs(env)),
        source=" + ".join(sources) or "defaults",
    )


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ["HOME"]) if environ.get("HOME") else Path.home()


def worker_kubeconfigs(environ: Mapping[str, str]) -> list[str]:
    value = environ.get("KUBECONFIG")
    entries = split_list(value, os.pathsep) if value else [str(_home(environ) / ".kube" / "config")]
    return [real_path(entry) for entry in entries]


def _sqlite_dir(url: str) -> str | None:
    if not url.startswith("sqlite:"):
        return None
    path = url.removeprefix("sqlite:").lstrip("/")
    path = path.split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    absolute = url.removeprefix("sqlite:").startswith("////")
    return os.path.dirname(("/" + path) if absolute else os.path.abspath(path))


def stackflow_paths(environ: Mapping[str, str], settings: PolicySettings) -> list[ProtectedPath]:
    """What no spec may touch, even inside a root: stackflow's home (its SQLite database,
    Terraform working directories), the state database's directory, the key file's
    directory, the policy file, the OpenTofu binary, its configuration and plugin caches,
    the kubeconfigs, stackflow's code and Python environment, /proc, /sys and /dev."""
    home = environ.get("STACKFLOW_HOME")
    found: list[tuple[str | None, str]] = [
        (home or str(_home(environ) / ".stackflow"), "stackflow's home (STACKFLOW_HOME)"),
        (_sqlite_dir(environ.get("STACKFLOW_STATE_URL", "")), "the state database's directory"),
        (str(_home(environ) / ".cache" / "stackflow"), "stackflow's tool cache"),
        (str(Path.home() / ".cache" / "stackflow"), "stackflow's tool cache"),
        ("/proc", "the kernel's process files"),
        ("/sys", "the kernel's system files"),
        ("/dev", "the devices"),
        (sys.prefix, "stackflow's Python environment"),
        (sys.base_prefix, "the Python installation"),
    ]
    key_file = environ.get("STACKFLOW_ENCRYPTION_KEY_FILE")
    if key_file:
        found.append((os.path.dirname(real_path(key_file)), "the encryption keys' directory"))
    if environ.get(POLICY_FILE_VAR):
        found.append((environ[POLICY_FILE_VAR], "the worker policy"))
    tf_config = environ.get("TF_CLI_CONFIG_FILE")
    if tf_config:
        found.append((os.path.dirname(real_path(tf_config)), "OpenTofu's configuration"))
    tf_bin = environ.get("STACKFLOW_TF_BIN")
    if tf_bin:
        found.append((os.path.dirname(real_path(tf_bin)), "the OpenTofu binary's directory"))
    for name in ("TF_PLUGIN_CACHE_DIR", "TF_DATA_DIR"):
        if environ.get(name):
            found.append((environ[name], f"OpenTofu's {name}"))
    for path in worker_kubeconfigs(environ):
        found.append((path, "the worker's kubeconfig"))
    for path in settings.kubernetes.allowed_kubeconfigs:
        found.append((path, "an allowed kubeconfig"))
    found.append((str(Path(__file__).resolve().parent), "stackflow's code"))
    if site.ENABLE_USER_SITE:
        found.append((site.getusersitepackages(), "the user's Python packages"))
    for path in settings.onprem.protected:
        found.append((path, "protected by the worker policy"))
    out: dict[str, ProtectedPath] = {}
    for where, reason in found:
        if where:
            real = real_path(where)
            out.setdefault(real, ProtectedPath(path=real, reason=reason))
    return list(out.values())


_cached: tuple[tuple[Any, ...], WorkerPolicy] | None = None
_cache_lock = threading.Lock()
_FINGERPRINT_NAMES = ("KUBECONFIG", "TF_CLI_CONFIG_FILE", "HOME")


_FINGERPRINT_BYTES = tuple(name.encode() for name in _FINGERPRINT_NAMES)


_seen_env: tuple[dict[bytes, bytes], tuple[Any, ...]] | None = None
"""The environment's bytes when last fingerprinted (a copy) and what they gave: an
environment equal to it (one comparison in C, values mostly the same objects) gives the same
items without walking every variable again, as each runtime call's policy check would."""


def _fingerprint(environ: Mapping[str, str]) -> tuple[Any, ...]:
    global _seen_env
    raw = getattr(environ, "_data", None)  # os.environ's own bytes: nothing decoded
    if isinstance(raw, dict):
        seen = _seen_env
        if seen is not None and seen[0] == raw:
            items: tuple[Any, ...] = seen[1]
        else:
            items = tuple(
                sorted(
                    (k, v)
                    for k, v in raw.items()
                    if k.startswith(b"STACKFLOW_") or k in _FINGERPRINT_BYTES
                )
            )
            _seen_env = (dict(raw), items)
    else:
        items = tuple(
            sorted(
                (k, v)
                for k, v in environ.items()
                if k.startswith("STACKFLOW_") or k in _FINGERPRINT_NAMES
            )
        )
    file = environ.get(POLICY_FILE_VAR)
    if file:
        try:
            st = os.stat(os.path.expanduser(file))
            return (*items, (st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            return (*items, None)
    return items


def worker_policy() -> WorkerPolicy:
    """This process's policy, from its environment; loaded again when the environment (or
    the policy file) changes."""
    global _cached
    key = _fingerprint(os.environ)
    with _cache_lock:
        if _cached is not None and _cached[0] == key:
            return _cached[1]
    policy = load_policy()
    with _cache_lock:
        _cached = (key, policy)
    return policy
