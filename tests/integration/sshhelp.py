"""Real OpenSSH servers for the OnPrem SSH tests: each host its own ``sshd`` (Debian's
openssh-server, run as the current user) on its own loopback address (127.0.0.2, .3, ...)
and a free port, with its own host key, the tests' client key authorised, and its own root
directory. The worker reaches them with the files :class:`SshHosts` writes (known_hosts,
an OpenSSH client config with an alias per host, the client key), named by the policy's
environment variables."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True
    )
    return path.with_suffix(".pub").read_text().strip()


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class Sshd:
    """One host: ``sshd -D -e -f <its config>``."""

    def __init__(self, base: Path, n: int, client_pub: str) -> None:
        self.n = n
        self.address = f"127.0.0.{n + 2}"
        self.alias = f"host{n}"
        self.dir = base / f"sshd{n}"
        self.root = base / f"root{n}"
        self.dir.mkdir(parents=True)
        self.root.mkdir(parents=True)
        self.host_pub = _keygen(self.dir / "host_key")
        (self.dir / "authorized_keys").write_text(client_pub + "\n")
        self.port = free_port(self.address)
        self.user = getpass.getuser()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@{self.address}:{self.port}"

    def config(self) -> str:
        d = self.dir
        return "\n".join(
            [
                f"ListenAddress {self.address}:{self.port}",
                f"HostKey {d / 'host_key'}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                "Subsystem sftp internal-sftp",
                "MaxSessions 64",
                "MaxStartups 100:30:200",
                "LogLevel ERROR",
                "",
            ]
        )

    def start(self, timeout: float = 10) -> None:
        cfg = self.dir / "sshd_config"
        cfg.write_text(self.config())
        log = (self.dir / "sshd.log").open("ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"sshd exited: {(self.dir / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"sshd on {self.address}:{self.port} did not listen within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def new_host_key(self) -> None:
        """A key other than the one the known-hosts file pins (as after a reinstall, or a
        machine in the middle)."""
        self.stop()
        for name in ("host_key", "host_key.pub"):
            (self.dir / name).unlink()
        _keygen(self.dir / "host_key")
        self.start()


class SshHosts:
    """``count`` hosts and the worker's files to reach them."""

    def __init__(self, base: Path, count: int) -> None:
        if not os.access(SSHD, os.X_OK):
            pytest.fail(f"{SSHD} is missing: run scripts/setup.sh (Debian openssh-server)")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.client_key = base / "client_key"
        pub = _keygen(self.client_key)
        self.hosts = [Sshd(base, n, pub) for n in range(count)]
        self.known_hosts = base / "known_hosts"
        self.known_hosts.write_text(
            "".join(f"[{h.address}]:{h.port} {h.host_pub}\n" for h in self.hosts)
        )
        self.ssh_config = base / "ssh_config"
        self.ssh_config.write_text(
            "".join(
                f"Host {h.alias}\n  HostName {h.address}\n  Port {h.port}\n  User {h.user}\n"
                for h in self.hosts
            )
        )

    def env(self) -> dict[str, str]:
        """The worker policy's settings for these hosts: each host (by address and by alias)
        allowed its own root only."""
        hosts = [f"{h.address}:{h.root}" for h in self.hosts]
        hosts += [f"{h.alias}:{h.root}" for h in self.hosts]
        return {
            "STACKFLOW_ONPREM_HOSTS": ",".join(hosts),
            "STACKFLOW_ONPREM_KNOWN_HOSTS": str(self.known_hosts),
            "STACKFLOW_ONPREM_SSH_CONFIG": str(self.ssh_config),
            "STACKFLOW_ONPREM_SSH_KEYS": str(self.client_key),
        }

    def __enter__(self) -> SshHosts:
        try:
            for host in self.hosts:
                host.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for host in self.hosts:
            host.stop()


def ssh_hosts(base: Path, count: int) -> Iterator[SshHosts]:
    with SshHosts(base, count) as hosts:
        yield hosts
