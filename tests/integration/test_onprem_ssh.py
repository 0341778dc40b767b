"""The OnPrem runtime on hosts reached over SSH, against real OpenSSH servers
(:mod:`tests.integration.sshhelp`): a worker of this tree, the CLI as users run it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.onprem import OnPremRuntime
from stackflow.runtimes.policy import load_policy
from stackflow.temporal.operation import OperationInput, StatusView
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import (
    cli_json,
    expect_exit,
    new_project,
    poll,
    start_run,
    write_spec,
)
from tests.integration.sshhelp import SshHosts


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[SshHosts]:
    with SshHosts(tmp_path / "ssh", 2) as found:
        yield found


@pytest.fixture
def ssh_env(stack_env: dict[str, str], hosts: SshHosts) -> dict[str, str]:
    return {**stack_env, **hosts.env()}


@pytest.fixture
def ssh_worker(tmp_path: Path, ssh_env: dict[str, str]) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(tmp_path, ssh_env["STACKFLOW_TASK_QUEUE"], ssh_env)
    worker.start()
    yield worker
    worker.stop()


def on_host(host: str, kind: str, path: Path, content: str | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {"kind": kind, "path": str(path), "host": host}
    if content is not None:
        attrs["content"] = content
    return {"id": f"onprem:{kind}:{host}:{path}", "type": "OnPrem", "attributes": attrs}


def test_apply_preview_drift_repair_destroy_on_two_hosts(
    tmp_path: Path, ssh_env: dict[str, str], hosts: SshHosts, ssh_worker: WorkerProcess
) -> None:
    env, project = ssh_env, new_project()
    a, b = hosts.hosts
    resources = []
    # one host by its ssh:// address, the other by its alias in the worker's SSH config
    for h, name in ((a, a.url), (b, b.alias)):
        app = h.root / "etc" / "app"
        resources.append(on_host(name, "Directory", app))
        resources += [on_host(name, "File", app / f"f{i}.conf", f"{h.n}:{i}\n") for i in range(5)]
    spec = write_spec(tmp_path / "spec.yaml", resources)

    done = cli_json(expect_exit(run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes",
                                        "-o", "json")))  # fmt: skip
    assert done["phase"] == "succeeded", done
    for h in hosts.hosts:
        for i in range(5):
            assert (h.root / "etc" / "app" / f"f{i}.conf").read_text() == f"{h.n}:{i}\n"
        assert sorted(p.name for p in (h.root / "etc" / "app").iterdir()) == [
            f"f{i}.conf" for i in range(5)
        ]

    preview = ["preview", "-f", str(spec), "-p", project, "-o", "json"]
    again = cli_json(expect_exit(run_cli(env, *preview)))
    assert again["summary"]["UnChanged"] == 12, again["summary"]

    # drift: a file edited on the host (and its mode changed) is shown, then repaired
    drifted = b.root / "etc" / "app" / "f3.conf"
    drifted.write_text("edited by hand\n")
    drifted.chmod(0o600)
    mode_only = a.root / "etc" / "app" / "f1.conf"
    mode_only.chmod(0o600)
    shown = cli_json(expect_exit(run_cli(env, *preview)))
    assert shown["summary"]["UnChanged"] == 10 and shown["summary"]["Update"] == 2, shown
    assert "edited by hand" in str(shown) and "0600" in str(shown)
    expect_exit(run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes"))
    assert drifted.read_text() == "1:3\n" and drifted.stat().st_mode & 0o777 == 0o644
    assert mode_only.stat().st_mode & 0o777 == 0o644

    expect_exit(run_cli(env, "destroy", "-p", project, "--yes"))
    assert not (a.root / "etc" / "app").exists() and not (b.root / "etc" / "app").exists()
    assert (a.root / "etc").is_dir()  # made for the Directory, not managed: left


def test_a_changed_host_key_is_refused_naming_the_host(
    tmp_path: Path, ssh_env: dict[str, str], hosts: SshHosts, ssh_worker: WorkerProcess
) -> None:
    a = hosts.hosts[0]
    a.new_host_key()
    spec = write_spec(tmp_path / "spec.yaml", [on_host(a.url, "File", a.root / "x.conf", "x\n")])
    out = expect_exit(run_cli(ssh_env, "apply", "-f", str(spec), "-p", new_project(), "--yes"), 2)
    lines = out.stderr.strip().splitlines()
    print(f"\n{lines}")
    assert len(lines) == 1 and a.url in lines[0] and "host key" in lines[0], out.stderr
    assert not (a.root / "x.conf").exists()


def test_an_unreachable_host_is_retried_then_fails_naming_it(
    tmp_path: Path, ssh_env: dict[str, str], hosts: SshHosts, ssh_worker: WorkerProcess
) -> None:
    a = hosts.hosts[0]
    a.stop()
    spec = write_spec(tmp_path / "spec.yaml", [on_host(a.url, "File", a.root / "x.conf", "x\n")])
    started = time.monotonic()
    out = run_cli(ssh_env, "apply", "-f", str(spec), "-p", new_project(), "--yes",
                  "--unavailable-timeout", "6")  # fmt: skip
    took = time.monotonic() - started
    print(f"\nexit {out.returncode} after {took:.1f}s: {out.stderr.strip()}")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and a.url in lines[0] and "unreachable" in lines[0], out.stderr
    assert took >= 6  # retried for the bound first


async def test_a_worker_killed_mid_apply_across_three_hosts_finishes_every_file(
    tmp_path: Path, stack_env: dict[str, str], temporal_client: Client
) -> None:
    with SshHosts(tmp_path / "ssh", 3) as three:
        env = {**stack_env, **three.env()}
        worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
        worker.start()
        try:
            await _kill_and_finish(three, env, worker, temporal_client)
        finally:
            worker.stop()


async def _kill_and_finish(
    three: SshHosts, env: dict[str, str], worker: WorkerProcess, temporal_client: Client
) -> None:
    files = 500
    where = [
        (three.hosts[i % 3], three.hosts[i % 3].root / "srv" / f"f{i:03d}") for i in range(files)
    ]
    spec = {
        "resources": [on_host(h.url, "File", p, f"content {i}\n") for i, (h, p) in enumerate(where)]
    }
    request = OperationInput(project=new_project(), spec=spec, auto_approve=True, max_concurrency=1)
    handle = await start_run(temporal_client, env, request)

    async def some_done() -> StatusView | None:
        status = await handle.query("status", result_type=StatusView)
        return status if status.phase == "applying" and status.done >= 150 else None

    await poll(some_done, timeout=120, what="150 resources applied")
    worker.kill()  # SIGKILL: a batch of SFTP writes is in flight
    on_disk = sum(len(list(h.root.glob("srv/*"))) for h in three.hosts)
    assert on_disk < files, "the run must be cut in the middle"
    print(f"\nkilled with {on_disk} of {files} names on the hosts")
    worker.start()
    result = await handle.result()
    assert result.phase == "succeeded", result.error
    for i, (_, path) in enumerate(where):
        assert path.read_text() == f"content {i}\n"
    for h in three.hosts:  # nothing partial, no temporary file left behind
        names = sorted(p.name for p in (h.root / "srv").iterdir())
        assert names == sorted(p.name for hh, p in where if hh is h)


async def test_a_call_that_fails_in_a_hosts_step_fails_alone(hosts: SshHosts) -> None:
    """A host's calls of a step run together on its connection: a path that is a directory
    (refused when read) and one whose temporary name a directory holds (failing when
    written) fail alone; the calls beside them in the same steps write their files."""
    env = {**hosts.env(), "STACKFLOW_ONPREM_ROOTS": str(hosts.base)}
    runtime = OnPremRuntime(load_policy(env))
    h, d = hosts.hosts[0], hosts.hosts[0].root / "step"
    (d / "a-dir").mkdir(parents=True)
    taken = d / f".stackflow-{hashlib.sha256(b'blocked.conf').hexdigest()[:16]}"
    taken.mkdir()
    (taken / "x").write_text("")
    names = [*(f"f{i}.conf" for i in range(20)), "a-dir", "blocked.conf"]
    requests = [
        ResourceRequest(id=name, type="OnPrem", attributes=on_host(h.url, "File", d / name, name)[
            "attributes"])
        for name in names
    ]  # fmt: skip
    options = RuntimeOptions(project=new_project(), workspace="default")
    try:
        results = await asyncio.gather(
            *(runtime.apply(r, options) for r in requests), return_exceptions=True
        )
    finally:
        await runtime.close()
    for name, result in zip(names[:20], results, strict=False):
        assert isinstance(result, dict), result
        assert (d / name).read_text() == name
    assert type(results[20]).__name__ == "Conflict" and "a-dir" in str(results[20])
    assert type(results[21]).__name__ == "Unavailable" and taken.name in str(results[21])
    assert not (d / "blocked.conf").exists() and (taken / "x").exists()


async def test_a_file_larger_than_one_sftp_request_is_written_and_read_whole(
    hosts: SshHosts,
) -> None:
    """Content over the server's largest write and read (OpenSSH: 255 KiB) goes as several
    requests sent at once, and is read back whole; a small file beside it in one request."""
    env = {**hosts.env(), "STACKFLOW_ONPREM_ROOTS": str(hosts.base)}
    runtime = OnPremRuntime(load_policy(env))
    h = hosts.hosts[1]
    big = "".join(f"line {i:07d}\n" for i in range(60_000))  # 780 KB
    files = {h.root / "big" / "big.conf": big, h.root / "big" / "small.conf": "small\n"}
    requests = [
        ResourceRequest(id=str(p), type="OnPrem", attributes=on_host(h.url, "File", p, c)[
            "attributes"])
        for p, c in files.items()
    ]  # fmt: skip
    options = RuntimeOptions(project=new_project(), workspace="default")
    try:
        await asyncio.gather(*(runtime.apply(r, options) for r in requests))
        lives = await asyncio.gather(*(runtime.read(r, options) for r in requests))
    finally:
        await runtime.close()
    for (path, content), live in zip(files.items(), lives, strict=True):
        assert path.read_text() == content
        assert live is not None and live["content"] == content


UNIT = "[Service]\nExecStart=/bin/sleep 9\n[Install]\nWantedBy=multi-user.target\n"


@pytest.mark.parametrize("over", ["ssh", "local"])
async def test_a_service_unit_is_written_enabled_disabled_and_removed_with_systemctl_root(
    hosts: SshHosts, over: str
) -> None:
    """Unit file and enablement through the real ``systemctl --root=<the host's root>``, run
    on the host over SSH or on this machine (no running systemd needed; start/stop are not
    offered)."""
    h = hosts.hosts[0]
    runtime = OnPremRuntime(load_policy({**hosts.env(), "STACKFLOW_ONPREM_ROOTS": str(h.root)}))
    options = RuntimeOptions(project="svc", workspace="default")
    unit = h.root / "etc" / "systemd" / "system" / "demo.service"
    wants = unit.parent / "multi-user.target.wants" / "demo.service"

    def service(**extra: Any) -> ResourceRequest:
        attrs = {"kind": "Service", "path": str(unit), "content": UNIT, **extra}
        if over == "ssh":
            attrs["host"] = h.url
        return ResourceRequest(id="svc", type="OnPrem", attributes=attrs)

    assert await runtime.read(service(), options) is None
    live = await runtime.apply(service(), options)
    assert live["enabled"] is True and unit.read_text() == UNIT
    assert os.readlink(wants) == "/etc/systemd/system/demo.service"
    assert await runtime.read(service(), options) == live  # what preview compares: no change

    assert (await runtime.apply(service(enabled=False), options))["enabled"] is False
    assert not wants.exists() and unit.exists()
    read = await runtime.read(service(), options)
    assert read is not None and read["enabled"] is False  # drift from enabled: shown

    await runtime.apply(service(), options)
    await runtime.delete(service(), options)
    assert not unit.exists() and not wants.exists()
    await runtime.close()


def test_hosts_pinned_to_task_queues_are_written_by_their_own_workers(
    tmp_path: Path, ssh_env: dict[str, str], hosts: SshHosts
) -> None:
    """Each host's alias pinned to a queue (``STACKFLOW_RUNTIME_QUEUES=onprem@host0=...``);
    a worker per queue that can reach its own host only (its known-hosts file pins that
    host's key alone), a main worker with no runtime: the apply succeeds only if each
    host's calls went to its own worker."""
    queue = ssh_env["STACKFLOW_TASK_QUEUE"]
    zones = {h.alias: f"{queue}-zone{h.n}" for h in hosts.hosts}
    routing = ",".join(f"onprem@{alias}={zone}" for alias, zone in zones.items())
    env = {**ssh_env, "STACKFLOW_RUNTIME_QUEUES": routing}
    workers = [WorkerProcess(tmp_path, queue, {**env, "STACKFLOW_WORKER_RUNTIMES": "main"})]
    lines = hosts.known_hosts.read_text().splitlines()
    for h in hosts.hosts:
        known = tmp_path / f"known_hosts{h.n}"
        known.write_text("".join(line + "\n" for line in lines if h.address in line))
        zone_env = {**env, "STACKFLOW_WORKER_RUNTIMES": f"onprem@{h.alias}",
                    "STACKFLOW_ONPREM_KNOWN_HOSTS": str(known)}  # fmt: skip
        workers.append(WorkerProcess(tmp_path, zones[h.alias], zone_env))
    for worker in workers:
        worker.start()
    try:
        resources = [
            on_host(h.alias, "File", h.root / f"z{i}.conf", f"{h.alias}:{i}\n")
            for h in hosts.hosts
            for i in range(3)
        ]
        spec = write_spec(tmp_path / "spec.yaml", resources)
        project = f"s44-{new_project()}"
        done = cli_json(expect_exit(run_cli(env, "apply", "-f", str(spec), "-p", project,
                                            "--yes", "-o", "json")))  # fmt: skip
        assert done["phase"] == "succeeded", done
        for h in hosts.hosts:
            for i in range(3):
                assert (h.root / f"z{i}.conf").read_text() == f"{h.alias}:{i}\n"
        again = cli_json(expect_exit(run_cli(env, "preview", "-f", str(spec), "-p", project,
                                             "-o", "json")))  # fmt: skip
        assert again["summary"]["UnChanged"] == 6, again["summary"]
        expect_exit(run_cli(env, "destroy", "-p", project, "--yes"))
        assert not [p for h in hosts.hosts for p in h.root.glob("z*.conf")]
    finally:
        for worker in workers:
            worker.stop()
