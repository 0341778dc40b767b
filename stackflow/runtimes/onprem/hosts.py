"""Where an OnPrem resource lives: ``host`` as a spec writes it.

``ssh://[user@]name[:port]`` names a host; a bare name is a host alias of the worker's
OpenSSH client configuration (``Host`` blocks of ~/.ssh/config or the policy's
``ssh_config``). No password in a spec: credentials are the worker's only. The worker policy
lists the hosts (globs on the name or the alias) and a project's roots on each
(:attr:`~stackflow.runtimes.policy.OnPremPolicy.hosts`).
"""

from __future__ import annotations

import functools
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy
from stackflow.runtimes.policy_paths import within

_ALIAS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$")


@dataclass(frozen=True)
class Host:
    text: str
    """As written (the host paths are owned on)."""
    name: str
    """The host name (or the alias) the policy's globs match."""
    user: str | None = None
    port: int | None = None
    alias: bool = False


@functools.lru_cache(maxsize=1024)
def parse_host(text: str) -> Host:
    """``text`` as a host (remembered: every call of a batch names one); ValueError says why
    it is not one."""
    if text.startswith("ssh://"):
        try:
            url = urlsplit(text)
            port = url.port
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if url.password is not None:
            raise ValueError(
                f"{text!r}: no password in a spec; credentials are the worker's (its SSH keys)"
            )
        if not url.hostname or url.path not in ("", "/") or url.query or url.fragment:
            raise ValueError(f"{text!r} is not ssh://[user@]name[:port]")
        return Host(text, url.hostname, url.username, port)
    if _ALIAS.match(text):
        return Host(text, text, alias=True)
    raise ValueError(
        f"{text!r} is neither ssh://[user@]name[:port] nor a host alias of the worker's SSH "
        "configuration"
    )


def host_roots(policy: WorkerPolicy, resource_id: str, host: Host, path: str) -> list[str]:
    """The roots on ``host`` ``path`` is (as written) inside of; PolicyViolation when the
    host is not the project's or the path is outside them."""
    roots = policy.onprem.host_roots(host.name)
    if not roots:
        raise PolicyViolation(
            resource_id,
            "attributes.host",
            f"{host.text}: not a host this worker's policy lets the project touch "
            f"(hosts: {', '.join(policy.onprem.hosts) or 'none'}; STACKFLOW_ONPREM_HOSTS)",
        )
    lexical = posixpath.normpath(path)
    if not any(within(lexical, root) for root in roots):
        raise PolicyViolation(
            resource_id,
            "attributes.path",
            f"{path} is outside this worker's roots on {host.text} ({', '.join(roots)})",
        )
    return roots
