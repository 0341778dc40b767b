"""OnPrem hosts as specs write them and as the worker policy allows them (no host is reached
here: tests/integration/test_onprem_ssh.py runs real sshd servers)."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

import pytest

from stackflow.runtimes.base import (
    Conflict,
    InvalidInput,
    ResourceRequest,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.onprem import OnPremRuntime
from stackflow.runtimes.onprem.files import os_errors, parse_attributes, systemctl_args
from stackflow.runtimes.onprem.hosts import Host, parse_host
from stackflow.runtimes.policy import PolicyConfigError, PolicyViolation
from tests.unit.test_project_policy import policy

OPTS = RuntimeOptions(project="team-a", workspace="w")


def request(host: str, path: str = "/srv/app/a.conf") -> ResourceRequest:
    attrs = {"kind": "File", "path": path, "content": "x\n", "host": host}
    return ResourceRequest(id="f", type="OnPrem", attributes=attrs)


def test_hosts_as_written() -> None:
    assert parse_host("ssh://deploy@web-1.dc:2222") == Host(
        "ssh://deploy@web-1.dc:2222", "web-1.dc", "deploy", 2222
    )
    assert parse_host("web1") == Host("web1", "web1", alias=True)
    for bad, why in [
        ("ssh://u:secret@web", "no password in a spec"),
        ("ssh://web/etc", "is not ssh://"),
        ("ssh://web:99999", "Port out of range"),
        ("web 1", "neither"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_host(bad)


def test_hosts_and_their_roots_are_checked_before_any_connection(tmp_path: Path) -> None:
    doc: dict[str, Any] = {
        "onprem": {"hosts": ["web-*:/srv", "db1:/etc/db"]},
        "projects": {"team-a": {"onprem": {"hosts": ["web-*:/srv/app"]}}},
    }
    rt = OnPremRuntime(policy(tmp_path, doc))
    rt.check_policy(request("ssh://root@web-1:22"), OPTS)  # nothing listens: never reached
    with pytest.raises(PolicyViolation, match="outside this worker's roots on ssh://web-2"):
        rt.check_policy(request("ssh://web-2", "/srv/other/a.conf"), OPTS)
    with pytest.raises(PolicyViolation, match="db1: not a host this worker's policy lets"):
        rt.check_policy(request("db1", "/etc/db/a.conf"), OPTS)
    with pytest.raises(
        InvalidInput, match=re.escape("attributes.host: 'ssh://u:pw@web-1': no password")
    ):
        rt.check_policy(request("ssh://u:pw@web-1"), OPTS)


def test_a_project_may_only_narrow_the_hosts(tmp_path: Path) -> None:
    for wider in ("*:/srv", "web-*:/", "web-1:/etc"):
        doc = {
            "onprem": {"hosts": ["web-*:/srv"]},
            "projects": {"p": {"onprem": {"hosts": [wider]}}},
        }
        with pytest.raises(PolicyConfigError, match=re.escape(f"onprem.hosts: {wider} is outside")):
            policy(tmp_path, doc)
    with pytest.raises(PolicyConfigError, match="is not '<host glob>:<absolute root>'"):
        policy(tmp_path, STACKFLOW_ONPREM_HOSTS="web-1")


def test_no_permission_is_bad_input_and_a_file_in_the_way_a_conflict() -> None:
    for code, kind in [(errno.EACCES, InvalidInput), (errno.EROFS, InvalidInput),
                       (errno.ENOTDIR, Conflict), (errno.ENOSPC, Unavailable)]:  # fmt: skip
        with pytest.raises(kind, match="f: cannot apply /srv/x"), os_errors("f", "apply"):
            raise OSError(code, os.strerror(code), "/srv/x")


@pytest.mark.parametrize(
    ("attrs", "problem"),
    [
        ({"kind": "Service", "path": "/etc/app.service"}, "path: a Service's unit file is"),
        ({"kind": "Service", "path": "/r/xetc/systemd/system/a.service"}, "path: a Service's"),
        ({"kind": "Service", "path": "/etc/systemd/system/a.conf"}, "path: a Service's unit"),
        ({"kind": "File", "path": "/srv/a", "enabled": True}, "enabled: only a Service"),
        ({"kind": "Service", "path": "/r/etc/systemd/system/a.service", "active": True}, "active"),
        ({"kind": "File", "path": "/srv/a", "active": True}, "active: only a Service"),
        (
            {"kind": "Service", "path": "/etc/systemd/system/a.service", "restartOn": [{}]},
            "restartOn: restarts need active: true",
        ),
    ],
)
def test_a_service_is_a_unit_file_under_etc_systemd_system(
    attrs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidInput, match=re.escape(f"f: attributes.{problem}")):
        parse_attributes(ResourceRequest(id="f", type="OnPrem", attributes=attrs))
    path = "/srv/host1/etc/systemd/system/web@1.service"
    assert systemctl_args(path) == ("--root=/srv/host1", "web@1.service")
    assert systemctl_args("/etc/systemd/system/a.timer") == ("--root=/", "a.timer")


def test_the_ssh_files_the_policy_names_are_out_of_every_specs_reach(tmp_path: Path) -> None:
    known = tmp_path / "root" / "ssh" / "known_hosts"
    p = policy(tmp_path, STACKFLOW_ONPREM_ROOTS=str(tmp_path / "root"),
               STACKFLOW_ONPREM_KNOWN_HOSTS=str(known))  # fmt: skip
    attrs = {"kind": "File", "path": str(known), "content": "[evil]:22 ssh-ed25519 AAAA\n"}
    with pytest.raises(PolicyViolation, match="no spec may touch it"):
        OnPremRuntime(p).check_policy(
            ResourceRequest(id="f", type="OnPrem", attributes=attrs), OPTS
        )
