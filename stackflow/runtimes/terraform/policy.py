"""The Terraform runtime's part of the worker policy: providers, provisioners and other
code-running blocks, files on the worker, and the environment OpenTofu gets.

``provisioner`` and ``connection`` blocks, code-running providers (``hashicorp/external``,
shell/exec providers), ``exec`` blocks and settings naming files on the worker
(``*_file(s)``, ``*_path(s)``, ``*_dir``) in ``extensions.providerMeta`` and Helm's
``postrender`` are refused unless ``STACKFLOW_ALLOW_PROVISIONERS=1``. Providers must match
``STACKFLOW_ALLOWED_TF_PROVIDERS`` (default ``hashicorp/*``; the built-in ``terraform``
provider is always allowed). Every argument of every resource type that names a file on the
worker (:func:`worker_paths`) is confined like an OnPrem path: inside the roots, never
stackflow's own files, the worker's credentials or ``/proc``.
``context.env`` may only name variables ``STACKFLOW_ALLOWED_ENV`` lists (names or globs,
default none); tool, loader, proxy/trust and stackflow's own variables are refused even
when a pattern matches. The CLI gets only what it needs from the worker's environment
(:func:`tool_env`). The settings themselves are read by :mod:`stackflow.runtimes.policy`.
"""

from __future__ import annotations

import fnmatch
import os
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from stackflow.runtimes.file_roots import onprem_target
from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy

PUBLIC_REGISTRIES = ("registry.terraform.io", "registry.opentofu.org")
BUILTIN_PROVIDER = "terraform.io/builtin/terraform"
CODE_PROVIDERS = frozenset({"external", "shell", "exec", "command"})
"""Provider types whose purpose is to run programs on the worker (``hashicorp/external``,
``scottwinkler/shell``, ...): allowed only with provisioners."""
CODE_BLOCKS = ("provisioner", "connection")
CODE_ARGUMENTS: dict[str, tuple[str, ...]] = {"helm_release": ("postrender",)}
"""Resource arguments that run a program on the worker, by resource type."""
WORKER_FILE_KEY = re.compile(
    r"^(file|filename|filepath|file_path|source|source_file|source_dir|source_path|"
    r"output_path|output_dir|destination_dir|template_dir|.+_file|.+_filename|.+_file_path)$",
    re.IGNORECASE,
)
"""Argument names (the last key, whatever the resource type) whose value names a file or
directory on the worker: ``aws_s3_object.source``, ``aws_lambda_function.filename``,
``local_file.filename``, ``archive_file.source_dir``, ``*.private_key_file``, ..."""
NOT_WORKER_FILES = (
    "archive_file.source.filename",
    "github_repository_file.file",
    "gitlab_repository_file.file_path",
    "docker_container.upload.file",
)
"""Arguments with such names that name no file on the worker (a name inside an archive, a
path in a repository or a container); the policy's ``remote_path_arguments`` adds more."""
_DIRECTORY_KEY = re.compile(r"(^|_)dir$", re.IGNORECASE)
_HOME = re.compile(r"^~[A-Za-z0-9_.-]*(/|$)")
_KERNEL_PATHS = ("/proc", "/sys", "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FILE_SETTING = re.compile(r"(^|_)(file|files|path|paths|dir)$", re.IGNORECASE)
_REFERENCE = "$kusion_path."
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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


def check_terraform(
    policy: WorkerPolicy,
    resource_id: str,
    *,
    provider_source: str,
    provider_name: str,
    resource_type: str,
    arguments: Mapping[str, Any],
    provider_meta: Mapping[str, Any],
) -> None:
    """Refuse a Terraform resource the policy forbids (no I/O but path resolution)."""
    tf = policy.terraform
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
        if not provider_allowed(policy, source):
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
    remote = (*NOT_WORKER_FILES, *tf.remote_path_arguments)
    for field, key, value in worker_paths(resource_type, arguments, remote):
        check_worker_path(policy, resource_id, field, key, value)


def worker_paths(
    resource_type: str, arguments: Mapping[str, Any], remote: tuple[str, ...] = NOT_WORKER_FILES
) -> Iterator[tuple[str, str, str]]:
    """(field, argument name, value) of each string argument, nested ones too, that names a
    file on the worker: any value that starts with ``~``, ``./``, ``../`` or ``file://`` or
    names ``/proc`` (``/sys``, ``/dev/fd``, ...), and any non-URL value of an argument whose
    name says it is a file (:data:`WORKER_FILE_KEY`) but for ``remote`` ones
    (``<type>.<keys>`` globs). A ``$kusion_path`` reference is checked once resolved."""
    for field, dotted, key, value in _walk_strings(arguments, "attributes", resource_type):
        if value.startswith(_REFERENCE) or not value:
            continue
        named = WORKER_FILE_KEY.match(key) is not None and not any(
            fnmatch.fnmatchcase(dotted, pattern) for pattern in remote
        )
        if (
            value.startswith(("./", "../", "file://"))
            or _HOME.match(value)
            or value in (".", "..")
            or _kernel(value)
            or (named and not _SCHEME.match(value) and "::" not in value)
        ):
            yield field, key, value


def check_worker_path(
    policy: WorkerPolicy, resource_id: str, field: str, key: str, value: str
) -> None:
    """Refuse a value naming a file on the worker outside the OnPrem roots or inside
    stackflow's own files, the worker's credentials, ``/proc``, ..."""
    path = value
    if value.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(value).path)
    if _HOME.match(path):
        raise PolicyViolation(
            resource_id,
            field,
            f"{value} names a file in the worker's home directory: use an absolute path "
            "inside the worker's OnPrem roots",
        )
    if not os.path.isabs(path):
        raise PolicyViolation(
            resource_id,
            field,
            f"{value} names a file on the worker relative to its working directory: {key} "
            "must be an absolute path inside the worker's OnPrem roots",
        )
    directory = _DIRECTORY_KEY.search(key) is not None
    onprem_target(policy, resource_id, path, field=field, directory=directory)


def _kernel(value: str) -> bool:
    path = os.path.normpath(value) if value.startswith("/") else ""
    return any(path == k or path.startswith(k + "/") for k in _KERNEL_PATHS)


def _walk_strings(
    value: Any, where: str, dotted: str, key: str = ""
) -> Iterator[tuple[str, str, str, str]]:
    """(field, ``type.keys`` without indexes, the last key, value) of every string."""
    if isinstance(value, str):
        yield where, dotted, key, value
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield from _walk_strings(item, f"{where}.{name}", f"{dotted}.{name}", str(name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk_strings(item, f"{where}[{index}]", dotted, key)


def provider_allowed(policy: WorkerPolicy, source: str) -> bool:
    parts = source.strip("/").lower().split("/")
    if len(parts) == 2:
        parts = [PUBLIC_REGISTRIES[1], *parts]
    if len(parts) != 3:
        return False
    full = "/".join(parts)
    for pattern in policy.terraform.allowed_providers:
        if pattern == "*":
            return True
        if pattern.count("/") == 2:
            if fnmatch.fnmatchcase(full, pattern):
                return True
        elif parts[0] in PUBLIC_REGISTRIES and fnmatch.fnmatchcase("/".join(parts[1:]), pattern):
            return True
    return False


def terraform_env(policy: WorkerPolicy, resource_id: str, env: Any) -> dict[str, str]:
    """``context.env`` as the CLI gets it, every name checked against the policy."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise PolicyViolation(resource_id, "context.env", "must be a map of environment variables")
    allowed = policy.terraform.allowed_env
    out: dict[str, str] = {}
    for key, value in env.items():
        name = str(key)
        field = f"context.env.{name}"
        if not _ENV_NAME.match(name):
            raise PolicyViolation(resource_id, field, "is not a valid variable name")
        reason = refused_env_reason(name)
        if reason is not None:
            raise PolicyViolation(resource_id, field, f"{name} {reason}: never taken from a spec")
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


def tool_env(policy: WorkerPolicy, environ: Mapping[str, str] | None = None) -> dict[str, str]:
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
            or any(fnmatch.fnmatchcase(name, p) for p in policy.terraform.pass_env)
        ):
            out[name] = value
    return out


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
