"""`stackflow release diff` and `stackflow output ID[.path]` over releases made by real runs:
the real CLI and worker, Temporal, the state backend, OnPrem files and the real Kubernetes
control plane. A stack is applied, changed and applied again; the diff names the changed
resources and fields (a Secret's change without its values) and output returns recorded
fields (a Secret's value masked unless --show-sensitive)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from stackflow.core.errors import NotFoundError
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.kubehelp import (
    config_map,
    delete_quietly,
    kusion_id,
    namespace,
    resource,
    secret,
    suffix,
)
from tests.integration.opshelp import cli_json, dir_resource, file_resource, new_project, write_spec
from tests.integration.opshelp import expect_exit as _ok

MARKER = "(sensitive value)"


@pytest.fixture(params=["sqlite", "postgresql"])
def state_kind(request: pytest.FixtureRequest) -> str:
    """Both state backends."""
    return str(request.param)


def _by_id(section: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in section["resources"]}


def _fields(change: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["path"]: f for f in change["fields"]}


async def test_onprem_release_diff_and_output(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    flags = ("--project", project)
    root = tmp_path / "site"
    d = dir_resource(root)
    a = file_resource(root / "a.conf", "a = 1\n", deps=[d["id"]])
    b = file_resource(root / "b.conf", "b = 1\n", deps=[d["id"]])
    c = file_resource(root / "c.conf", "c = 1\n", deps=[d["id"]])
    first = write_spec(tmp_path / "one.yaml", [d, a, b])
    b2 = file_resource(root / "b.conf", "b = 2\n", deps=[d["id"]])
    second = write_spec(tmp_path / "two.yaml", [d, b2, c])  # a removed, b changed, c added
    for spec in (first, second):
        applied = cli_json(
            _ok(run_cli(env, "apply", "-f", str(spec), *flags, "--yes", "-o", "json"))
        )
        assert applied["phase"] == "succeeded"

    found = cli_json(_ok(run_cli(env, "release", "diff", *flags, "1", "2", "-o", "json")))
    assert (found["old_revision"], found["new_revision"]) == (1, 2)
    for name in ("spec", "state"):
        section = found[name]
        changes = _by_id(section)
        assert {rid: r["change"] for rid, r in changes.items()} == {
            a["id"]: "removed",
            b["id"]: "changed",
            c["id"]: "added",
        }, name
        assert _fields(changes[b["id"]]) == {
            "content": {
                "path": "content",
                "kind": "changed",
                "old": "b = 1\n",
                "new": "b = 2\n",
                "sensitive": False,
            }
        }
        assert section["summary"] == {"added": 1, "removed": 1, "changed": 1, "unchanged": 1}
    table = _ok(run_cli(env, "release", "diff", *flags, "1", "2")).stdout
    assert f"~ {b['id']}" in table and 'content: "b = 1\\n" → "b = 2\\n"' in table
    assert f"+ {c['id']}" in table and f"- {a['id']}" in table

    same = cli_json(_ok(run_cli(env, "release", "diff", *flags, "2", "2", "-o", "json")))
    assert same["spec"]["resources"] == [] and same["state"]["resources"] == []
    missing = _ok(run_cli(env, "release", "diff", *flags, "1", "9"), NotFoundError.exit_code)
    assert (
        missing.stderr == f"Error: release 9 of {project}/default does not exist (revisions 1-2)\n"
    )
    assert missing.stdout == ""

    # output: the id holds dots and slashes; the longest recorded id wins
    content = _ok(run_cli(env, "output", *flags, f"{b['id']}.content"))
    assert content.stdout == "b = 2\n" == (root / "b.conf").read_text()
    assert cli_json(_ok(run_cli(env, "output", *flags, f"{c['id']}.mode", "-o", "json"))) == "0644"
    recorded = cli_json(_ok(run_cli(env, "output", *flags, c["id"], "-o", "json")))
    assert recorded == {
        "kind": "File",
        "path": str(root / "c.conf"),
        "mode": "0644",
        "content": "c = 1\n",
    }
    # --resource still answers as before
    legacy = cli_json(_ok(run_cli(env, "output", *flags, "--resource", b["id"])))
    assert legacy == {b["id"]: {**recorded, "path": str(root / "b.conf"), "content": "b = 2\n"}}
    gone = _ok(run_cli(env, "output", *flags, f"{a['id']}.content"), NotFoundError.exit_code)
    assert gone.stderr == (
        f"Error: {a['id']}.content: no such resource in release 2 of {project}/default\n"
    )
    no_field = _ok(run_cli(env, "output", *flags, f"{b['id']}.owner"), NotFoundError.exit_code)
    assert (
        no_field.stderr == f"Error: {b['id']}: no field owner in release 2 of {project}/default\n"
    )


@pytest.mark.parametrize("state_kind", ["postgresql"], indirect=True)
async def test_kubernetes_release_diff_and_output_with_a_secret(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess, api: k8s.ApiClient
) -> None:
    env, project, ns = stack_env, new_project(), f"sf-{suffix()}"
    assert env.get("STACKFLOW_ENCRYPTION_KEY_FILE") or env.get("STACKFLOW_ENCRYPTION_KEY"), (
        "the dev loop seals sensitive values"
    )
    flags = ("--project", project)
    old_pw, new_pw = f"old-{suffix()}-Pw", f"new-{suffix()}-Pw"
    planted = [old_pw, new_pw, *(base64.b64encode(p.encode()).decode() for p in (old_pw, new_pw))]
    ns_id = kusion_id(namespace(ns))

    def spec(name: str, mode: str, password: str) -> Path:
        return write_spec(
            tmp_path / name,
            [
                resource(namespace(ns)),
                resource(config_map(ns, "settings", {"mode": mode, "size": "3"}), deps=[ns_id]),
                resource(secret(ns, "creds", {"password": password}), deps=[ns_id]),
            ],
        )

    cm_id, secret_id = f"v1:ConfigMap:{ns}:settings", f"v1:Secret:{ns}:creds"
    outputs: list[str] = []

    def cli(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        proc = _ok(run_cli(env, *args), code)
        outputs.append(proc.stdout + proc.stderr)
        return proc

    try:
        for file in (spec("one.yaml", "fast", old_pw), spec("two.yaml", "slow", new_pw)):
            applied = cli_json(cli("apply", "-f", str(file), *flags, "--yes", "-o", "json"))
            assert applied["phase"] == "succeeded"
        live = k8s.CoreV1Api(api).read_namespaced_secret("creds", ns)
        assert live.data["password"] == base64.b64encode(new_pw.encode()).decode()

        found = cli_json(cli("release", "diff", *flags, "1", "2", "-o", "json"))
        for name in ("spec", "state"):
            changes = _by_id(found[name])
            assert set(changes) == {cm_id, secret_id}, name
            mode = _fields(changes[cm_id])["data.mode"]
            assert (mode["kind"], mode["old"], mode["new"]) == ("changed", "fast", "slow")
            assert "data.size" not in _fields(changes[cm_id])
        spec_secret = _fields(_by_id(found["spec"])[secret_id])
        state_secret = _fields(_by_id(found["state"])[secret_id])
        assert spec_secret["stringData.password"] == {
            "path": "stringData.password",
            "kind": "changed",
            "old": MARKER,
            "new": MARKER,
            "sensitive": True,
        }
        assert state_secret["data.password"] == {
            "path": "data.password",
            "kind": "changed",
            "old": MARKER,
            "new": MARKER,
            "sensitive": True,
        }
        assert found["state"]["summary"]["unchanged"] == 1  # the namespace
        table = cli("release", "diff", *flags, "1", "2").stdout
        assert 'data.mode: "fast" → "slow"' in table
        assert "data.password: changed (sensitive)" in table
        assert "stringData.password: changed (sensitive)" in table

        # output: a recorded field, plain for $(...); a label key with dots and slashes
        assert cli("output", *flags, f"{cm_id}.data.mode").stdout == "slow\n"
        managed = cli("output", *flags, f"{cm_id}.metadata.labels.app.kubernetes.io/managed-by")
        assert managed.stdout == "stackflow\n"
        # the Secret: masked unless asked
        masked = cli("output", *flags, f"{secret_id}.data.password")
        assert masked.stdout == MARKER + "\n" and "--show-sensitive" in masked.stderr
        whole = cli_json(cli("output", *flags, secret_id, "-o", "json"))
        assert whole["data"] == MARKER and whole["kind"] == "Secret"
        cli("output", *flags, "-o", "table")
        for text in outputs:
            for secret_text in planted:
                assert secret_text not in text, "a secret value was printed"
        shown = _ok(
            run_cli(env, "output", *flags, f"{secret_id}.data.password", "--show-sensitive")
        )
        assert shown.stdout == live.data["password"] + "\n"
        missing = cli("output", *flags, f"{cm_id}.data.speed", code=NotFoundError.exit_code)
        assert missing.stderr == (
            f"Error: {cm_id}: no field data.speed in release 2 of {project}/default\n"
        )
    finally:
        delete_quietly(api, namespaces=[ns])
