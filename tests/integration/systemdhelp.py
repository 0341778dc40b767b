"""A machine with a real systemd as PID 1 for the OnPrem Service tests, isolated from this one.

systemd runs only inside a root filesystem of its own: the Debian root ``scripts/setup.sh
systemd-root`` builds once with debootstrap (systemd, openssh-server) under the cache, seen
through an overlay per machine (the changes go to the machine's own directory, the cached
root is never written). It starts in new PID, mount, UTS, IPC and cgroup namespaces
(``unshare``), in a cgroup of its own, and ``pivot_root``s into the overlay before anything
runs, unmounting the old root: nothing of this machine's filesystem is visible to it (its
``/tmp``, ``/run``, ``/work`` are its root's own). ``/proc``, a read-only ``/sys``, its
cgroup (cgroup2) and a ``/dev`` of a few device nodes are mounted for it.

The network namespace is shared: its sshd listens on one loopback address and a free port
only, and the root enables no network unit (no networkd, no resolved), so the machine
changes nothing of this one's network; sharing it keeps the worker's connection plain (no
veth, no addresses to allocate among concurrent test runs).

:meth:`Machine.start` first boots the same namespaces with a harmless PID 1 (``sleep``)
and checks from inside that ``/`` is the machine's root and that this machine's ``/tmp``
and ``/work`` are not visible, and only then boots systemd. sshd runs under that systemd;
its host key (made here) is pinned in the known-hosts file the worker uses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.sshhelp import _keygen, free_port

VERSION = "bookworm-systemd-openssh-1"  # scripts/setup.sh SYSTEMD_ROOT_VERSION
CACHE = Path(os.environ.get("STACKFLOW_CACHE", Path.home() / ".cache" / "stackflow"))
ROOT = CACHE / "roots" / VERSION
CGROUP2 = Path("/sys/fs/cgroup/unified")
ADDRESS = "127.0.0.44"
MARK = "/.stackflow-machine"
"""A file only the machine's root holds: PID 1 checks it is there before anything runs."""

# Runs as PID 1 of the new namespaces, in the new mount namespace (private propagation):
# mounts the machine's filesystems under $M, pivots into it, unmounts the old root, then
# execs "$@" (sleep or systemd). Every mount made here dies with the namespace.
_BOOT = r"""
set -eu
M="$1"; shift
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$UPPER,workdir=$WORKDIR" "$M"
mount -t proc proc "$M/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$M/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$M/sys/fs/cgroup"
mount -t tmpfs -o mode=0755,nosuid tmpfs "$M/dev"
# Device nodes of its own on its own tmpfs, never bind mounts of the host's: systemd makes
# /dev/console root:tty 0620, and through a bind mount of the host's /dev/null it once did
# that to the host's (PostgreSQL's initdb, not root, then failed on it).
mknod -m 666 "$M/dev/null" c 1 3; mknod -m 666 "$M/dev/zero" c 1 5
mknod -m 666 "$M/dev/full" c 1 7; mknod -m 666 "$M/dev/random" c 1 8
mknod -m 666 "$M/dev/urandom" c 1 9; mknod -m 666 "$M/dev/tty" c 5 0
mknod -m 600 "$M/dev/console" c 1 3
mkdir "$M/dev/pts" "$M/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$M/dev/pts"
ln -s pts/ptmx "$M/dev/ptmx"
hostname "$HOSTNAME_"
cd "$M"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
test -e "$MARK"
exec "$@"
"""


class Machine:
    """One isolated machine: systemd as PID 1 in its own root, sshd on ``ADDRESS``:``port``
    as root, reached with ``client_key`` and pinned by ``known_hosts``."""

    def __init__(self, base: Path) -> None:
        if not (ROOT / "stamp").is_file():
            pytest.fail(f"{ROOT} is missing: run scripts/setup.sh systemd-root (debootstrap)")
        if os.geteuid() != 0:
            pytest.fail("the systemd machine needs root (namespaces, mounts)")
        self.base = base
        self.name = f"s44-{uuid.uuid4().hex[:8]}"
        self.cgroup = CGROUP2 / f"stackflow-{self.name}"
        self.port = free_port(ADDRESS)
        self.proc: subprocess.Popen[bytes] | None = None
        base.mkdir(parents=True, exist_ok=True)
        self.client_key = base / "client_key"
        self.known_hosts = base / "known_hosts"
        self.log = base / "boot.log"

    @property
    def url(self) -> str:
        return f"ssh://root@{ADDRESS}:{self.port}"

    # ---- the machine's own files (its overlay's upper directory, before it boots) ---------
    def _prepare(self) -> None:
        for d in ("upper", "work", "merged"):
            shutil.rmtree(self.base / d, ignore_errors=True)
            (self.base / d).mkdir()
        upper = self.base / "upper"
        ssh = upper / "etc" / "ssh"
        (ssh / "sshd_config.d").mkdir(parents=True)
        key = ssh / "ssh_host_ed25519_key"
        host_pub = _keygen(key).split()[:2]
        (ssh / "sshd_config.d" / "stackflow.conf").write_text(
            f"ListenAddress {ADDRESS}:{self.port}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"HostKey /etc/ssh/ssh_host_ed25519_key\nMaxSessions 64\n"
        )
        root_ssh = upper / "root" / ".ssh"
        root_ssh.mkdir(parents=True, mode=0o700)
        if not self.client_key.exists():
            _keygen(self.client_key)
        (root_ssh / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        (upper / MARK.lstrip("/")).write_text(self.name + "\n")
        (upper / "etc" / "hostname").write_text(self.name + "\n")
        self.known_hosts.write_text(f"[{ADDRESS}]:{self.port} {' '.join(host_pub)}\n")

    def _boot(self, *pid1: str) -> subprocess.Popen[bytes]:
        """``pid1`` as PID 1 of new namespaces, in the machine's root (see _BOOT)."""
        self.cgroup.mkdir(exist_ok=True)
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LOWER": str(ROOT / "root"),
            "UPPER": str(self.base / "upper"),
            "WORKDIR": str(self.base / "work"),
            "HOSTNAME_": self.name,
            "MARK": MARK,
            "container": "stackflow-test",
        }
        procs = str(self.cgroup / "cgroup.procs")

        def into_cgroup() -> None:  # the cgroup namespace's root is this cgroup
            with open(procs, "w") as f:
                f.write("0")

        command = ["unshare", "--pid", "--mount", "--uts", "--ipc", "--cgroup", "--fork",
                   "--kill-child", "--propagation", "private", "--",
                   "/bin/sh", "-c", _BOOT, "boot", str(self.base / "merged"), *pid1]  # fmt: skip
        with self.log.open("ab") as log:
            return subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                preexec_fn=into_cgroup, start_new_session=True,
            )  # fmt: skip

    def _pid1(self, proc: subprocess.Popen[bytes], timeout: float = 10) -> int:
        """The host's pid of the namespace's PID 1 (unshare's child)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the machine exited at boot: {self.log.read_text()[-2000:]}")
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if children:
                return int(children[0])
            time.sleep(0.02)
        pytest.fail("the machine's PID 1 did not start")

    def inside(self, pid: int, *command: str) -> str:
        """``command`` run in the machine's namespaces (its root), its output."""
        done = subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "-p", "-u", "-i", "-r", "-w", "--", *command],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return done.stdout + done.stderr

    def check_isolated(self) -> None:
        """Boots ``sleep`` as PID 1 and checks from inside that only the machine's root is
        there; fails the test (systemd never started) otherwise."""
        marker = Path("/tmp") / f"stackflow-{self.name}-host-only"
        marker.write_text("the host's /tmp\n")
        proc = self._boot("/bin/sleep", "600")
        try:
            pid = self._pid1(proc)
            deadline = time.monotonic() + 10
            while self.inside(pid, "cat", MARK).strip() != self.name:
                if time.monotonic() > deadline:
                    pytest.fail(f"the machine's root is not in place: {self.log.read_text()}")
                time.sleep(0.05)
            seen = {
                "pid1": self.inside(pid, "cat", "/proc/1/comm").strip(),
                "tmp": self.inside(pid, "ls", "-A", "/tmp").split(),
                "work": self.inside(pid, "ls", "/work").strip(),
                "mounts": self.inside(pid, "cat", "/proc/self/mountinfo"),
            }
            assert seen["pid1"] == "sleep", seen
            assert marker.name not in seen["tmp"], seen  # not the host's /tmp
            assert "No such file" in seen["work"], seen
            points = [line.split()[4] for line in seen["mounts"].splitlines()]
            assert not [p for p in points if p.startswith(("/.oldroot", "/work"))], points
        finally:
            marker.unlink()
            self._stop(proc)

    def start(self, timeout: float = 60) -> None:
        self._prepare()
        self.check_isolated()
        self._prepare()  # a fresh overlay for systemd
        self.proc = self._boot("/lib/systemd/systemd", "--unit=multi-user.target")
        self.pid = self._pid1(self.proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"systemd exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((ADDRESS, self.port), timeout=1) as sock:
                    if sock.recv(8).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.2)
        state = self.inside(self.pid, "systemctl", "--no-pager", "status", "ssh.service")
        self.stop()
        pytest.fail(f"sshd under the machine's systemd did not answer in {timeout}s: {state}")

    def env(self, *roots: str) -> dict[str, str]:
        """The worker policy's settings to reach this machine, allowed ``roots`` on it."""
        return {
            "STACKFLOW_ONPREM_HOSTS": ",".join(f"{ADDRESS}:{root}" for root in roots),
            "STACKFLOW_ONPREM_KNOWN_HOSTS": str(self.known_hosts),
            "STACKFLOW_ONPREM_SSH_KEYS": str(self.client_key),
        }

    def systemctl(self, *args: str) -> str:
        assert self.proc is not None
        return self.inside(self.pid, "systemctl", "--no-pager", *args).strip()

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                os.kill(int(child), signal.SIGKILL)  # PID 1 gone: the whole namespace goes
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for cg in sorted(self.cgroup.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if cg.is_dir():
                _rmdir_cgroup(cg)
        _rmdir_cgroup(self.cgroup)

    def stop(self) -> None:
        if self.proc is not None:
            self._stop(self.proc)
            self.proc = None

    def __enter__(self) -> Machine:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _rmdir_cgroup(path: Path) -> None:
    deadline = time.monotonic() + 10
    while path.exists():
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
