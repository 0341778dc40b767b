"""The worker policy: what a spec may make this worker do.

Spec authors write specs; whoever runs the worker decides what specs may do on it. The
policy is set on the worker - environment variables, optionally a YAML file named by
``STACKFLOW_POLICY_FILE`` (a variable that is set wins over the file) - and checked when a
resource is previewed (before any runtime call: no ``tofu init``, no file read, no
Kubernetes request), again before it is applied or deleted, and by the runtimes themselves
on every call. A violation is a :class:`PolicyViolation` (a :class:`SpecError`: exit 2, one
line naming the resource and the field).

Terraform
    ``provisioner`` and ``connection`` blocks, code-running providers (``hashicorp/external``,
    shell/exec providers), ``exec`` blocks and settings naming files on the worker
    (``*_file(s)``, ``*_path(s)``, ``*_dir``) in ``extensions.providerMeta`` and Helm's
    ``postrender`` are refused unless ``STACKFLOW_ALLOW_PROVISIONERS=1``. Providers must match
    ``STACKFLOW_ALLOWED_TF_PROVIDERS`` (default ``hashicorp/*``; the built-in ``terraform``
    provider is always allowed). Resources that read or write files on the worker
    (``local_file``, ``archive_file``, ``template_dir``) are confined like OnPrem paths.
    ``context.env`` may only name variables ``STACKFLOW_ALLOWED_ENV`` lists (names or globs,
    default none); tool, loader, proxy/trust and stackflow's own variables are refused even
    when a pattern matches. The CLI gets only what it needs from the worker's environment
    (:meth:`WorkerPolicy.tool_env`).
Kubernetes
    kubeconfig paths only from ``STACKFLOW_ALLOWED_KUBECONFIGS`` (files or directories; the
    worker's own ``KUBECONFIG`` is always allowed); contexts from
    ``STACKFLOW_ALLOWED_KUBE_CONTEXTS`` when set; exec credential and auth-provider plugins
    only with ``STACKFLOW_ALLOW_KUBE_EXEC=1`` (read from the file before the client loads it).
OnPrem
    paths only under ``STACKFLOW_ONPREM_ROOTS`` (none by default: OnPrem is refused until a
    root is configured), resolved through symlinks, never stackflow's own state, keys,
    working directories, tools or code (:func:`stackflow_paths`); content and files read at
    most ``STACKFLOW_ONPREM_MAX_BYTES`` (default 1 MiB).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import site
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, field_validator

from stackflow.errors import SpecError, StackflowError

MIB = 1024 * 1024
POLICY_FILE_VAR = "STACKFLOW_POLICY_FILE"
KUBECONFIG_MAX_BYTES = 4 * MIB
"""A kubeconfig larger than this is not read (nor loaded)."""
POLICY_FILE_MAX_BYTES = MIB

PUBLIC_REGISTRIES = ("registry.terraform.io", "registry.opentofu.org")
BUILTIN_PROVIDER = "terraform.io/builtin/terraform"
DEFAULT_TF_PROVIDERS = ("hashicorp/*",)
CODE_PROVIDERS = frozenset({"external", "shell", "exec", "command"})
"""Provider types whose purpose is to run programs on the worker (``hashicorp/external``,
``scottwinkler/shell``, ...): allowed only with provisioners."""
CODE_BLOCKS = ("provisioner", "connection")
CODE_ARGUMENTS: dict[str, tuple[str, ...]] = {"helm_release": ("postrender",)}
"""Resource arguments that run a program on the worker, by resource type."""
WORKER_FILE_ARGUMENTS: dict[str, tuple[tuple[str, bool], ...]] = {
    # resource type: (argument, names a directory)
    "local_file": (("filename", False), ("source", False)),
    "local_sensitive_file": (("filename", False), ("source", False)),
    "archive_file": (("source_file", False), ("source_dir", True), ("output_path", False)),
    "template_dir": (("source_dir", True), ("destination_dir", True)),
}
"""Resource arguments naming files on the worker: confined like OnPrem paths."""
_FILE_SETTING = re.compile(r"(^|_)(file|files|path|paths|dir)$", re.IGNORECASE)
_REFERENCE = "$kusion_path."

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+$")

_TOOLS = "controls OpenTofu/Terraform"
_LOADER = "controls how programs are loaded or run"
_TRUST = "controls the worker's network trust or proxies"
_OWN = "is the worker's own configuration"
_PROGRAMS = "points a tool at configuration that can run programs"
REFUSED_ENV: dict[str, str] = {
    **dict.fromkeys(
        ("PATH", "HOME", "SHELL", "ENV", "BASH_ENV", "IFS", "CDPATH", "PWD", "TMPDIR", "TMP"),
        _LOADER,
    ),
    **dict.fromkeys(("TEMP", "USER", "LOGNAME", "NODE_OPTIONS", "PERLLIB"), _LOADER),
    **dict.fromkeys(("GODEBUG", "GOFLAGS", "GOROOT", "GOPATH", "GOENV", "GOTOOLCHAIN"), _LOADER),
    **dict.fromkeys(("CHECKPOINT_DISABLE", "TERRAFORM_CONFIG"), _TOOLS),
    **dict.fromkeys(
        ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR"),
        _TRUST,
    ),
    **dict.fromkeys(("CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"), _TRUST),
    **dict.fromkeys(
        (
            "KUBECONFIG",
            "KUBE_CONFIG_PATH",
            "KUBE_CONFIG_PATHS",
            "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE",
            "GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES",
        ),
        _PROGRAMS,
    ),
}
"""Variables never taken from a spec, whatever ``STACKFLOW_ALLOWED_ENV`` says (compared
upper-cased)."""
REFUSED_ENV_PREFIXES: tuple[tuple[str, str], ...] = (
    ("TF_", _TOOLS),
    ("TOFU_", _TOOLS),
    ("OPENTOFU_", _TOOLS),
    ("LD_", _LOADER),
    ("DYLD_", _LOADER),
    ("PYTHON", _LOADER),
    ("PERL5", _LOADER),
    ("RUBY", _LOADER),
    ("BASH_FUNC_", _LOADER),
    ("GIT_", _LOADER),
    ("SSH_", _LOADER),
    ("XDG_", _LOADER),
    ("STACKFLOW_", _OWN),
    ("TEMPORAL_", _OWN),
    ("REDIS_", _OWN),
)

TOOL_ENV_NAMES = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
)
"""What OpenTofu gets from the worker's environment (plus the worker's ``LC_*`` and ``TF_*``
settings and ``STACKFLOW_TF_PASS_ENV``): never its state URL, keys or service addresses."""
NEVER_PASSED_PREFIXES = ("STACKFLOW_", "TEMPORAL_", "REDIS_")


class PolicyViolation(SpecError):
    """The worker's policy refuses what a resource asks for."""

    def __init__(self, resource_id: str, field: str, problem: str) -> None:
        super().__init__(f"{resource_id}: {field}: {problem}")
        self.resource_id = resource_id
        self.field = field


class PolicyConfigError(StackflowError):
    """The worker's policy settings are invalid (a worker problem, not the spec's)."""


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


@functools.lru_cache(maxsize=16)
def _real_roots(roots: tuple[str, ...]) -> list[str]:
    """The configured roots, resolved once per worker (paths under them are resolved on
    every check)."""
    return [_real(root) for root in roots]


def _split(raw: str, sep: str) -> list[str]:
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


class PolicySettings(_Section):
    """What the policy file (and the environment variables) set."""

    terraform: TerraformPolicy = Field(default_factory=TerraformPolicy)
    kubernetes: KubernetesPolicy = Field(default_factory=KubernetesPolicy)
    onprem: OnPremPolicy = Field(default_factory=OnPremPolicy)


class ProtectedPath(_Section):
    path: str
    reason: str


class OnPremTarget(_Section):
    """Where an OnPrem path lives once checked: its real parent directory ``parent``, the
    final component ``name``, and the directory ``anchor`` (a root, or a root's parent when
    the target is the root itself) to walk from without following symlinks."""

    path: str
    anchor: str
    parent: str
    name: str

    @property
    def real(self) -> str:
        return os.path.join(self.parent, self.name)


class WorkerPolicy(PolicySettings):
    """The settings plus what this worker keeps to itself (found by :func:`load_policy`)."""

    protected: tuple[ProtectedPath, ...] = ()
    worker_kubeconfigs: tuple[str, ...] = ()
    """The worker's own kubeconfig files (``KUBECONFIG``, else ~/.kube/config)."""
    source: str = "defaults"

    # ---- Terraform -----------------------------------------------------------------------
    def check_terraform(
        self,
        resource_id: str,
        *,
        provider_source: str,
        provider_name: str,
        resource_type: str,
        arguments: Mapping[str, Any],
        provider_meta: Mapping[str, Any],
    ) -> None:
        """Refuse a Terraform resource the policy forbids (no I/O but path resolution)."""
        tf = self.terraform
        providers = []
        if provider_source != BUILTIN_PROVIDER:
            providers.append((provider_source, provider_name, "provider"))
        # OpenTofu infers a resource's provider from its type's prefix (or the `provider`
        # argument): one not named in extensions.provider is hashicorp's, installed implicitly.
        implied = {resource_type.split("_", 1)[0]}
        if isinstance(arguments.get("provider"), str):
            implied.add(arguments["provider"].split(".", 1)[0])
        local = "terraform" if provider_source == BUILTIN_PROVIDER else provider_name
        for name in sorted(implied - {local, "terraform"}):
            providers.append((f"{PUBLIC_REGISTRIES[1]}/hashicorp/{name}", name, "resourceType"))
        for source, name, via in providers:
            field = "extensions.provider"
            how = f"provider {source}"
            if via != "provider":
                field = "extensions.resourceType"
                how = f"{resource_type} needs provider {source}, which"
            if not self.provider_allowed(source):
                raise PolicyViolation(
                    resource_id,
                    field,
                    f"{how} is not one this worker allows "
                    f"(STACKFLOW_ALLOWED_TF_PROVIDERS: {', '.join(tf.allowed_providers)})",
                )
            if name.lower() in CODE_PROVIDERS and not tf.allow_provisioners:
                raise PolicyViolation(
                    resource_id,
                    field,
                    f"{how} runs programs on the worker; this worker does not allow that "
                    "(STACKFLOW_ALLOW_PROVISIONERS)",
                )
        if not tf.allow_provisioners:
            for key in CODE_BLOCKS:
                if key in arguments:
                    raise PolicyViolation(
                        resource_id,
                        f"attributes.{key}",
                        f"{key} blocks run commands on the worker or other machines; this "
                        "worker does not allow them (STACKFLOW_ALLOW_PROVISIONERS)",
                    )
            for key in CODE_ARGUMENTS.get(resource_type, ()):
                if key in arguments:
                    raise PolicyViolation(
                        resource_id,
                        f"attributes.{key}",
                        f"{resource_type}.{key} runs a program on the worker; this worker "
                        "does not allow that (STACKFLOW_ALLOW_PROVISIONERS)",
                    )
            for where, key in _walk_keys(provider_meta, "extensions.providerMeta"):
                if key.lower() == "exec":
                    raise PolicyViolation(
                        resource_id,
                        where,
                        "exec blocks run a program on the worker; this worker does not allow "
                        "them (STACKFLOW_ALLOW_PROVISIONERS)",
                    )
                if _FILE_SETTING.search(key):
                    raise PolicyViolation(
                        resource_id,
                        where,
                        "provider settings may not name files or directories on the worker "
                        "(configuration there can run programs); this worker does not allow "
                        "them (STACKFLOW_ALLOW_PROVISIONERS)",
                    )
        for key, directory in WORKER_FILE_ARGUMENTS.get(resource_type, ()):
            value = arguments.get(key)
            if value is None or (isinstance(value, str) and value.startswith(_REFERENCE)):
                continue  # unset, or known at apply (checked again then)
            field = f"attributes.{key}"
            if not isinstance(value, str) or not os.path.isabs(value):
                raise PolicyViolation(
                    resource_id,
                    field,
                    f"{resource_type} touches files on the worker: {key} must be an absolute "
                    "path inside the worker's OnPrem roots",
                )
            self.onprem_target(resource_id, value, field=field, directory=directory)

    def provider_allowed(self, source: str) -> bool:
        parts = source.strip("/").lower().split("/")
        if len(parts) == 2:
            parts = [PUBLIC_REGISTRIES[1], *parts]
        if len(parts) != 3:
            return False
        full = "/".join(parts)
        for pattern in self.terraform.allowed_providers:
            if pattern == "*":
                return True
            if pattern.count("/") == 2:
                if fnmatch.fnmatchcase(full, pattern):
                    return True
            elif parts[0] in PUBLIC_REGISTRIES and fnmatch.fnmatchcase(
                "/".join(parts[1:]), pattern
            ):
                return True
        return False

    def terraform_env(self, resource_id: str, env: Any) -> dict[str, str]:
        """``context.env`` as the CLI gets it, every name checked against the policy."""
        if env is None:
            return {}
        if not isinstance(env, Mapping):
            raise PolicyViolation(
                resource_id, "context.env", "must be a map of environment variables"
            )
        allowed = self.terraform.allowed_env
        out: dict[str, str] = {}
        for key, value in env.items():
            name = str(key)
            field = f"context.env.{name}"
            if not _ENV_NAME.match(name):
                raise PolicyViolation(resource_id, field, "is not a valid variable name")
            reason = refused_env_reason(name)
            if reason is not None:
                raise PolicyViolation(
                    resource_id, field, f"{name} {reason}: never taken from a spec"
                )
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed):
                raise PolicyViolation(
                    resource_id,
                    field,
                    f"{name} is not a variable this worker takes from specs "
                    f"(STACKFLOW_ALLOWED_ENV: {', '.join(allowed) or 'none'})",
                )
            if isinstance(value, Mapping | list) or value is None:
                raise PolicyViolation(resource_id, field, "must be a string")
            text = str(value)
            if "\0" in text:
                raise PolicyViolation(resource_id, field, "holds a NUL character")
            out[name] = text
        return out

    def tool_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """What the worker's environment gives OpenTofu: the basics it needs to run, the
        worker's ``LC_*``/``TF_*`` settings and ``STACKFLOW_TF_PASS_ENV``; never stackflow's
        own state URL, keys or service addresses."""
        source = os.environ if environ is None else environ
        out: dict[str, str] = {}
        for name, value in source.items():
            if name.startswith(NEVER_PASSED_PREFIXES):
                continue
            if (
                name in TOOL_ENV_NAMES
                or name.startswith(("LC_", "TF_"))
                or any(fnmatch.fnmatchcase(name, p) for p in self.terraform.pass_env)
            ):
                out[name] = value
        return out

    # ---- Kubernetes ----------------------------------------------------------------------
    def check_kubeconfig(
        self,
        resource_id: str,
        kubeconfig: str | None,
        context: str | None,
        *,
        config_field: str,
        context_field: str,
    ) -> None:
        """Refuse a kubeconfig (a path or ``os.pathsep`` list; None: the worker's own) or a
        context the policy forbids, and kubeconfigs whose user runs a plugin."""
        kube = self.kubernetes
        if kubeconfig:
            files = []
            for entry in _split(kubeconfig, os.pathsep):
                real = _real(entry)
                if not self._kubeconfig_allowed(real):
                    raise PolicyViolation(
                        resource_id,
                        config_field,
                        f"{entry} is not a kubeconfig this worker allows "
                        "(STACKFLOW_ALLOWED_KUBECONFIGS)",
                    )
                files.append(real)
            field = config_field
        else:
            files = list(self.worker_kubeconfigs)
            field = "the worker's KUBECONFIG"
        if kube.allow_exec and kube.allowed_contexts is None:
            return  # nothing to look for in the files
        docs: list[tuple[str, dict[str, Any]]] = []
        for path in files:
            doc = _kubeconfig_doc(resource_id, field, path)
            if doc is not None:
                docs.append((path, doc))
        if not docs:
            if context and kube.allowed_contexts is not None:
                self._check_context(resource_id, context_field, context)
            return  # no file: in-cluster, or the client reports the missing file
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
            self._check_context(resource_id, context_field if context else field, chosen)
        if kube.allow_exec:
            return
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

    def _kubeconfig_allowed(self, real: str) -> bool:
        if real in self.worker_kubeconfigs:
            return True
        for entry in self.kubernetes.allowed_kubeconfigs:
            allowed = _real(entry)
            if real == allowed or (os.path.isdir(allowed) and _within(real, allowed)):
                return True
        return False

    def _check_context(self, resource_id: str, field: str, context: str) -> None:
        allowed = self.kubernetes.allowed_contexts or ()
        if not any(fnmatch.fnmatchcase(context, pattern) for pattern in allowed):
            raise PolicyViolation(
                resource_id,
                field,
                f"context {context!r} is not one this worker allows "
                f"(STACKFLOW_ALLOWED_KUBE_CONTEXTS: {', '.join(allowed) or 'none'})",
            )

    # ---- OnPrem (and files other runtimes touch) ------------------------------------------
    def onprem_target(
        self,
        resource_id: str,
        path: str,
        *,
        field: str = "attributes.path",
        directory: bool = False,
        reading: bool = False,
    ) -> OnPremTarget:
        """Where ``path`` lives, once it is known to be inside a root (through symlinks) and
        outside stackflow's own paths; ``reading``: an existing file must not be too large."""
        roots = _real_roots(tuple(self.onprem.roots))
        if not roots:
            raise PolicyViolation(
                resource_id,
                field,
                f"{path}: this worker manages no files for specs (it has no "
                "STACKFLOW_ONPREM_ROOTS)",
            )
        lexical = os.path.normpath(path)
        parent = _real(os.path.dirname(lexical))
        name = os.path.basename(lexical)
        if not name or name in (".", ".."):
            raise PolicyViolation(resource_id, field, f"{path} names no file or directory")
        via_parent = os.path.join(parent, name) if name else parent
        # realpath(path) is the resolved parent joined with the name unless the name itself
        # is a symlink: one lstat instead of resolving every component a second time
        real = _real(lexical) if os.path.islink(via_parent) else via_parent
        for candidate in dict.fromkeys((via_parent, real)):
            if not any(_within(candidate, root) for root in roots):
                resolved = f" (it resolves to {candidate})" if candidate != lexical else ""
                raise PolicyViolation(
                    resource_id,
                    field,
                    f"{path} is outside this worker's OnPrem roots ({', '.join(roots)}){resolved}",
                )
            for protected in self.protected:
                if candidate == protected.path:
                    how = "is"
                elif _within(candidate, protected.path):
                    how = "is inside"
                elif directory and _within(protected.path, candidate):
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
                self.check_size(resource_id, field, st.st_size, f"the file at {path}")
        if via_parent in roots:  # the root itself: walk from the directory above it
            anchor = os.path.dirname(via_parent)
        else:
            anchor = next(root for root in roots if _within(via_parent, root))
        return OnPremTarget(path=lexical, anchor=anchor, parent=parent, name=name)

    def check_size(self, resource_id: str, field: str, size: int, what: str) -> None:
        limit = int(self.onprem.max_bytes)
        if size > limit:
            raise PolicyViolation(
                resource_id,
                field,
                f"{what} is {size} bytes, over this worker's limit of {limit} bytes "
                "(STACKFLOW_ONPREM_MAX_BYTES)",
            )

    def check_content(self, resource_id: str, content: str | None) -> None:
        if content is not None and len(content) * 4 > int(self.onprem.max_bytes):
            size = len(content.encode("utf-8", errors="surrogatepass"))
            self.check_size(resource_id, "attributes.content", size, "the content")

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
        )


def refused_env_reason(name: str) -> str | None:
    """Why ``name`` is never taken from a spec, or None."""
    upper = name.upper()
    if upper in REFUSED_ENV:
        return REFUSED_ENV[upper]
    for prefix, reason in REFUSED_ENV_PREFIXES:
        if upper.startswith(prefix):
            return reason
    return None


def _walk_keys(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every mapping key under ``value``, with its dotted field path."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            path = f"{where}.{key}"
            yield path, str(key)
            yield from _walk_keys(item, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk_keys(item, f"{where}[{index}]")


def _named(doc: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    items = doc.get(key)
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _provider_name(value: Any) -> str:
    return str(value.get("name")) if isinstance(value, dict) else "?"


_kube_cache: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
_kube_lock = threading.Lock()


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
        block[key] = raw if how in ("bool", "text") else _split(raw, how)
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
        protected=tuple(stackflow_paths(env, settings)),
        worker_kubeconfigs=tuple(worker_kubeconfigs(env)),
        source=" + ".join(sources) or "defaults",
    )


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ["HOME"]) if environ.get("HOME") else Path.home()


def worker_kubeconfigs(environ: Mapping[str, str]) -> list[str]:
    value = environ.get("KUBECONFIG")
    entries = _split(value, os.pathsep) if value else [str(_home(environ) / ".kube" / "config")]
    return [_real(entry) for entry in entries]


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
        found.append((os.path.dirname(_real(key_file)), "the encryption keys' directory"))
    if environ.get(POLICY_FILE_VAR):
        found.append((environ[POLICY_FILE_VAR], "the worker policy"))
    tf_config = environ.get("TF_CLI_CONFIG_FILE")
    if tf_config:
        found.append((os.path.dirname(_real(tf_config)), "OpenTofu's configuration"))
    tf_bin = environ.get("STACKFLOW_TF_BIN")
    if tf_bin:
        found.append((os.path.dirname(_real(tf_bin)), "the OpenTofu binary's directory"))
    for name in ("TF_PLUGIN_CACHE_DIR", "TF_DATA_DIR"):
        if environ.get(name):
            found.append((environ[name], f"OpenTofu's {name}"))
    for path in worker_kubeconfigs(environ):
        found.append((path, "the worker's kubeconfig"))
    for path in settings.kubernetes.allowed_kubeconfigs:
        found.append((path, "an allowed kubeconfig"))
    code = Path(__file__).resolve().parent.parent
    for name in ("stackflow", "activities", "runtimes", "workflows", "cli", "worker.py"):
        found.append((str(code / name), "stackflow's code"))
    if site.ENABLE_USER_SITE:
        found.append((site.getusersitepackages(), "the user's Python packages"))
    for path in settings.onprem.protected:
        found.append((path, "protected by the worker policy"))
    out: dict[str, ProtectedPath] = {}
    for where, reason in found:
        if where:
            real = _real(where)
            out.setdefault(real, ProtectedPath(path=real, reason=reason))
    return list(out.values())


_cached: tuple[tuple[Any, ...], WorkerPolicy] | None = None
_cache_lock = threading.Lock()
_FINGERPRINT_NAMES = ("KUBECONFIG", "TF_CLI_CONFIG_FILE", "HOME")


def _fingerprint(environ: Mapping[str, str]) -> tuple[Any, ...]:
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
