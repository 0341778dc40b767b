"""The OnPrem Service kind against a real systemd running as PID 1 of a machine the tests
boot in namespaces of their own, on a root filesystem of its own
(:mod:`tests.integration.systemdhelp`), reached over SSH as any host: start, stop, one
restart per apply when the unit or a ``restartOn`` resource changed, the live state beside
the desired one, destroy."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.onprem import OnPremRuntime
from stackflow.runtimes.policy import load_policy
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import cli_json, expect_exit, new_project, write_spec
from tests.integration.systemdhelp import Machine


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    before = device_modes()
    with Machine(tmp_path / "machine") as found:
        yield found
    # its systemd set up its own console and devices, never the host's
    assert device_modes() == before


def test_the_machine_sees_only_its_own_root(tmp_path: Path) -> None:
    """The launcher's check (sleep as PID 1: its own /tmp, no /work) passes, and a machine
    left running is gone with its PID 1."""
    m = Machine(tmp_path / "machine")
    m._prepare()
    m.check_isolated()
    assert not m.cgroup.exists()


HOST_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/tty", "/dev/console")


def device_modes() -> dict[str, tuple[int, int, int]]:
    return {d: (s.st_mode, s.st_uid, s.st_gid) for d in HOST_DEVICES for s in [os.stat(d)]}


UNIT = (
    "[Service]\nExecStartPre=/bin/sh -c 'echo start >> /var/log/demo.starts'\n"
    "ExecStart=/bin/sleep 600\n{extra}[Install]\nWantedBy=multi-user.target\n"
)
CONF = "/etc/demo/demo.conf"
SERVICE_PATH = "/etc/systemd/system/demo.service"


async def test_a_service_is_started_restarted_once_per_change_stopped_and_destroyed(
    machine: Machine,
) -> None:
    m = machine
    runtime = OnPremRuntime(load_policy(m.env("/etc/systemd/system", "/etc/demo")))
    options = RuntimeOptions(project="s44-svc", workspace="default")
    conf = ResourceRequest(
        id="conf", type="OnPrem", attributes={"kind": "File", "path": CONF, "content": "a=1\n",
                                              "host": m.url},
    )  # fmt: skip
    recorded: dict[str, Any] = {}

    def service(extra: str = "", **attrs: Any) -> ResourceRequest:
        # as the engine sends it: restartOn's "$kusion_path.conf" resolved to conf's live
        # state, the last apply's result as the prior state
        body = {"kind": "Service", "path": SERVICE_PATH, "content": UNIT.format(extra=extra),
                "host": m.url, "active": True, "restartOn": [recorded["conf"]]}  # fmt: skip
        body.update(attrs)
        return ResourceRequest(
            id="svc", type="OnPrem", attributes=body, prior_state=recorded.get("svc")
        )

    def starts() -> int:
        return len(m.inside(m.pid, "cat", "/var/log/demo.starts").split())

    async def apply(request: ResourceRequest) -> dict[str, Any]:
        recorded[request.id] = await runtime.apply(request, options)
        return recorded[request.id]

    await apply(conf)
    assert await runtime.read(service(), options) is None
    live = await apply(service())
    assert live["active"] is True and live["enabled"] is True
    assert m.systemctl("is-active", "demo.service") == "active" and starts() == 1
    pid = m.systemctl("show", "-p", "MainPID", "--value", "demo.service")
    # preview: the live state as desired, nothing to do, nothing restarted
    assert await runtime.read(service(), options) == live
    await apply(service())
    assert starts() == 1

    # a restartOn file changed (written first: it is the Service's dependency): one restart
    await apply(conf.model_copy(update={"attributes": {**conf.attributes, "content": "a=2\n"}}))
    await apply(service())
    assert starts() == 2 and m.systemctl("show", "-p", "MainPID", "--value", "demo.service") != pid
    # the unit changed: reloaded, restarted once, runs the new unit
    await apply(service("Environment=V=2\n"))
    assert starts() == 3
    assert "V=2" in m.systemctl("show", "-p", "Environment", "--value", "demo.service")

    # stopped by hand: drift shown (live active false beside the desired true), then repaired
    m.systemctl("stop", "demo.service")
    read = await runtime.read(service("Environment=V=2\n"), options)
    assert read is not None and read["active"] is False
    await apply(service("Environment=V=2\n"))
    assert m.systemctl("is-active", "demo.service") == "active" and starts() == 4

    live = await apply(service("Environment=V=2\n", active=False))
    assert live["active"] is False and m.systemctl("is-active", "demo.service") == "inactive"
    await apply(service("Environment=V=2\n"))
    assert starts() == 5

    # destroy: stopped, disabled, removed, and systemd no longer knows the unit's file
    await runtime.delete(service("Environment=V=2\n"), options)
    assert m.systemctl("is-active", "demo.service") == "inactive"
    assert "No such file" in m.inside(m.pid, "ls", SERVICE_PATH)
    assert "No such file" in m.inside(
        m.pid, "ls", "/etc/systemd/system/multi-user.target.wants/demo.service"
    )
    assert m.systemctl("show", "-p", "LoadState", "--value", "demo.service") == "not-found"
    await runtime.close()


def test_a_service_through_the_cli_restarts_once_when_its_restart_on_file_changes(
    tmp_path: Path, stack_env: dict[str, str], machine: Machine
) -> None:
    """The engine's part: ``restartOn`` listing resource ids (each read as the
    ``$kusion_path`` reference it means, which previews the same: the file written first,
    its live state handed to the Service), the preview of the live state, destroy; an
    unknown id refused at preview."""
    m = machine
    env = {**stack_env, **m.env("/etc/systemd/system", "/etc/demo")}
    worker = WorkerProcess(tmp_path, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    try:
        _cli_service(tmp_path, env, m)
    finally:
        worker.stop()


def _cli_service(tmp_path: Path, env: dict[str, str], m: Machine) -> None:
    conf_id = f"onprem:File:{CONF}"

    def spec(conf: str, listed: str = conf_id) -> Path:
        return write_spec(tmp_path / "spec.yaml", [
            {"id": conf_id, "type": "OnPrem",
             "attributes": {"kind": "File", "path": CONF, "content": conf, "host": m.url}},
            {"id": "onprem:Service:demo", "type": "OnPrem",
             "attributes": {"kind": "Service", "path": SERVICE_PATH, "host": m.url,
                            "content": UNIT.format(extra=""), "active": True,
                            "restartOn": [listed]}},
        ])  # fmt: skip

    def starts() -> int:
        return len(m.inside(m.pid, "cat", "/var/log/demo.starts").split())

    project = f"s44-{new_project()}"
    apply = ["apply", "-p", project, "--yes", "-o", "json"]
    preview = ["preview", "-p", project, "-o", "json"]
    first = cli_json(expect_exit(run_cli(env, *preview, "-f", str(spec("a=1\n")))))
    assert first["summary"]["Create"] == 2, first["summary"]
    # the Service reads the file's state once it is written: a dependency, as the reference
    restart_on = next(c for c in first["changes"] if c["id"] == "onprem:Service:demo")["diff"]
    assert {"path": "restartOn[0]", "old": None, "new": "(known after apply)"} in restart_on
    written = cli_json(
        expect_exit(run_cli(env, *preview, "-f", str(spec("a=1\n", f"$kusion_path.{conf_id}"))))
    )
    assert written["changes"] == first["changes"], (written, first)
    unknown = expect_exit(run_cli(env, *preview, "-f", str(spec("a=1\n", "onprem:File:/x"))), 2)
    assert unknown.stderr.strip().endswith(
        "resources[1] (id 'onprem:Service:demo'): attributes.restartOn[0]: "
        "unknown resource 'onprem:File:/x'"
    ), unknown.stderr
    done = cli_json(expect_exit(run_cli(env, *apply, "-f", str(spec("a=1\n")))))
    assert done["phase"] == "succeeded", done
    assert m.systemctl("is-active", "demo.service") == "active" and starts() == 1
    again = cli_json(expect_exit(run_cli(env, *preview, "-f", str(spec("a=1\n")))))
    assert again["summary"]["UnChanged"] == 2, again["summary"]
    expect_exit(run_cli(env, *apply, "-f", str(spec("a=1\n"))))
    assert starts() == 1  # nothing changed: not restarted

    m.systemctl("stop", "demo.service")  # drift: the live active beside the desired one
    shown = cli_json(expect_exit(run_cli(env, *preview, "-f", str(spec("a=1\n")))))
    assert shown["summary"]["Update"] == 1 and "active" in str(shown), shown
    expect_exit(run_cli(env, *apply, "-f", str(spec("a=1\n"))))
    assert m.systemctl("is-active", "demo.service") == "active" and starts() == 2

    expect_exit(run_cli(env, *apply, "-f", str(spec("a=2\n"))))
    assert m.inside(m.pid, "cat", CONF) == "a=2\n" and starts() == 3  # one restart

    expect_exit(run_cli(env, "destroy", "-p", project, "--yes"))
    assert m.systemctl("show", "-p", "LoadState", "--value", "demo.service") == "not-found"
    assert "No such file" in m.inside(m.pid, "ls", CONF)
