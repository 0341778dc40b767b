"""Paths on the worker as the worker policy sees them: resolved (through symlinks), one
inside another, and the paths no spec may touch, whatever the policy's roots
(:func:`stackflow_paths`): stackflow's own files, the worker user's credentials, the
kernel's files."""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

POLICY_FILE_VAR = "STACKFLOW_POLICY_FILE"


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def real_path(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def split_list(raw: str, sep: str) -> list[str]:
    return [item.strip() for item in raw.split(sep) if item.strip()]


class ProtectedPath(BaseModel):
    """A path no spec may touch, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    reason: str


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


CREDENTIAL_DIRS = (
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".terraform.d",
    ".terraformrc",
    ".tofurc",
)
"""What the worker user's home holds credentials in: no spec may touch them."""


def stackflow_paths(
    environ: Mapping[str, str],
    allowed_kubeconfigs: Iterable[str] = (),
    protected: Iterable[str] = (),
) -> list[ProtectedPath]:
    """What no spec may touch, even inside a root: stackflow's home (its SQLite database,
    Terraform working directories), the state database's directory, the worker user's
    credentials (``~/.ssh``, ``~/.aws``, ... :data:`CREDENTIAL_DIRS`), the key file's
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
    for home_dir in dict.fromkeys((_home(environ), Path.home())):
        for name in CREDENTIAL_DIRS:
            found.append((str(home_dir / name), "the worker user's credentials"))
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
    for path in allowed_kubeconfigs:
        found.append((path, "an allowed kubeconfig"))
    found.append((str(Path(__file__).resolve().parents[1]), "stackflow's code"))
    if site.ENABLE_USER_SITE:
        found.append((site.getusersitepackages(), "the user's Python packages"))
    for path in protected:
        found.append((path, "protected by the worker policy"))
    out: dict[str, ProtectedPath] = {}
    for where, reason in found:
        if where:
            real = real_path(where)
            out.setdefault(real, ProtectedPath(path=real, reason=reason))
    return list(out.values())
