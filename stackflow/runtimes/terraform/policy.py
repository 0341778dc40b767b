"""The Terraform runtime's part of the worker policy: providers, provisioners and other
code-running blocks, files on the worker, and the environment OpenTofu gets.

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
(:func:`tool_env`). The settings themselves are read by :mod:`stackflow.policy`.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from stackflow.policy import PolicyViolation, WorkerPolicy
from stackflow.runtimes.onprem.policy import onprem_target

PUBLIC_REGISTRIES = ("registry.terraform.io", "registry.opentofu.org")
BUILTIN_PROVIDER = "terraform.io/builtin/terraform"
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
        onprem_target(policy, resource_id, value, field=field, directory=directory)


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
