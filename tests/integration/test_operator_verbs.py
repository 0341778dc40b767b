"""What operators reach for after the first apply, through the real CLI and worker on the
dev services (OnPrem files): rollback, --target / --exclude, and the ETA of a walk.
Kubernetes and refresh/drift have their own modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import (
    all_releases,
    cli_json,
    dir_resource,
    file_resource,
    new_project,
    write_spec,
)
from tests.integration.opshelp import (
    expect_exit as _ok,
)


def _apply(env: dict[str, str], spec: Path, project: str, *extra: str) -> dict[str, Any]:
    result: dict[str, Any] = cli_json(
        _ok(run_cli(env, "apply", "-f", str(spec), "-p", project, "--yes", "-o", "json", *extra))
    )
    assert result["phase"] == "succeeded", result
    return result


def test_rollback_restores_an_earlier_release_and_records_where_it_came_from(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    root = tmp_path / "site"
    d = dir_resource(root)
    a1 = file_resource(root / "a.conf", "version = 1\n", deps=[d["id"]])
    b = file_resource(root / "b.conf", "only in one\n", deps=[d["id"]])
    a2 = file_resource(root / "a.conf", "version = 2\n", deps=[d["id"]])
    c = file_resource(root / "c.conf", "only in two\n", deps=[d["id"]])
    _apply(env, write_spec(tmp_path / "one.yaml", [d, a1, b]), project)
    _apply(env, write_spec(tmp_path / "two.yaml", [d, a2, c]), project)
    assert (root / "a.conf").read_text() == "version = 2\n" and not (root / "b.conf").exists()

    rolled = cli_json(
        _ok(run_cli(env, "rollback", "-p", project, "--to", "1", "--yes", "-o", "json"))
    )
    assert rolled["phase"] == "succeeded" and rolled["revision"] == 3
    assert rolled["operation"] == "rollback"
    summary = rolled["changes"]["summary"]
    assert (summary["Create"], summary["Update"], summary["Delete"]) == (1, 1, 1)
    # release 1's content is back on disk, and what only release 2 had is gone
    assert (root / "a.conf").read_text() == "version = 1\n"
    assert (root / "b.conf").read_text() == "only in one\n"
    assert not (root / "c.conf").exists()
    rel = {r.revision: r for r in all_releases(env, project)}
    assert rel[3].operation == "rollback" and rel[3].source_revision == 1
    assert rel[3].spec_ref == rel[1].spec_ref
    assert {r.id for r in rel[3].state.resources} == {d["id"], a1["id"], b["id"]}

    # a revision that does not exist: one line, bad input, no release written
    missing = _ok(run_cli(env, "rollback", "-p", project, "--to", "9", "--yes"), 2)
    assert "has no release 9" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    assert max(r.revision for r in all_releases(env, project)) == 3


def test_exclude_leaves_a_resource_and_its_dependents_untouched(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    root = tmp_path / "site"
    d = dir_resource(root)
    base = file_resource(root / "base.conf", "base 1\n", deps=[d["id"]])
    child = file_resource(root / "child.conf", "child 1\n", deps=[base["id"]])
    other = file_resource(root / "other.conf", "other 1\n", deps=[d["id"]])
    _apply(env, write_spec(tmp_path / "one.yaml", [d, base, child, other]), project)
    before = {r.id: r for r in all_releases(env, project)[-1].state.resources}

    base2 = file_resource(root / "base.conf", "base 2\n", deps=[d["id"]])
    child2 = file_resource(root / "child.conf", "child 2\n", deps=[base["id"]])
    other2 = file_resource(root / "other.conf", "other 2\n", deps=[d["id"]])
    spec2 = write_spec(tmp_path / "two.yaml", [d, base2, child2, other2])

    preview = cli_json(
        _ok(
            run_cli(
                env,
                "preview",
                "-f",
                str(spec2),
                "-p",
                project,
                "-o",
                "json",
                "--exclude",
                "*base.conf",
            )
        )
    )
    left = {x["id"]: x for x in preview["left_out"]["resources"]}
    assert preview["left_out"]["count"] == 2
    assert left[base["id"]]["reason"] == "excluded"
    assert left[child["id"]]["reason"] == "depends on an excluded resource"
    assert left[child["id"]]["via"] == base["id"]
    shown = {c["id"]: c["action"] for c in preview["changes"]}
    assert shown.get(other["id"]) == "Update" and base["id"] not in shown

    applied = _apply(env, spec2, project, "--exclude", "*base.conf")
    assert applied["changes"]["left_out"]["count"] == 2
    assert (root / "other.conf").read_text() == "other 2\n"
    assert (root / "base.conf").read_text() == "base 1\n"
    assert (root / "child.conf").read_text() == "child 1\n"
    after = {r.id: r for r in all_releases(env, project)[-1].state.resources}
    for rid in (base["id"], child["id"]):
        assert after[rid].attributes == before[rid].attributes  # carried over unchanged

    # a pattern that matches nothing is a mistake: one line, exit 2
    typo = _ok(
        run_cli(env, "apply", "-f", str(spec2), "-p", project, "--yes", "--exclude", "nope*"), 2
    )
    assert "--exclude nope*: matches no resource" in typo.stderr


def test_target_applies_only_the_target_and_its_dependencies(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    env, project = stack_env, new_project()
    root = tmp_path / "site"
    d = dir_resource(root)
    a = file_resource(root / "a.conf", "a\n", deps=[d["id"]])
    b = file_resource(root / "b.conf", "b\n", deps=[a["id"]])
    c = file_resource(root / "c.conf", "c\n", deps=[d["id"]])
    spec = write_spec(tmp_path / "one.yaml", [d, a, b, c])

    applied = _apply(env, spec, project, "--target", "*a.conf")
    assert applied["changes"]["summary"]["Create"] == 2
    assert (root / "a.conf").exists() and not (root / "b.conf").exists()
    assert not (root / "c.conf").exists()
    recorded = {r.id for r in all_releases(env, project)[-1].state.resources}
    assert recorded == {d["id"], a["id"]}

    # destroy --target deletes the target and what depends on it, keeps the rest
    _apply(env, spec, project)  # everything
    destroyed = cli_json(
        _ok(run_cli(env, "destroy", "-p", project, "--yes", "-o", "json", "--target", "*a.conf"))
    )
    assert destroyed["phase"] == "succeeded"
    assert not (root / "a.conf").exists() and not (root / "b.conf").exists()
    assert (root / "c.conf").exists()
    recorded = {r.id for r in all_releases(env, project)[-1].state.resources}
    assert recorded == {d["id"], c["id"]}


def test_the_cli_shows_an_eta_while_a_300_resource_apply_runs(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    """On a terminal the progress bar carries ``ETA …`` (the run's status query estimates it
    from the rate of finished nodes)."""
    import os
    import pty
    import select
    import subprocess as sp
    import sys

    env, project = stack_env, new_project()
    root = tmp_path / "many"
    d = dir_resource(root)
    # Five chains of 60 files, each file after the one before it in its chain: the walk
    # takes 60 rounds, each an activity's round trip (seconds however fast one is), so the
    # CLI's status polls (every 0.25 s) find it under way. 299 files ready at once were
    # written in a few batches, sometimes all between two polls: no estimate was shown.
    files: list[dict[str, Any]] = []
    for i in range(299):
        before = files[i - 5]["id"] if i >= 5 else d["id"]
        files.append(file_resource(root / f"f{i:03}.txt", f"{i}\n", deps=[before]))
    spec = write_spec(tmp_path / "many.yaml", [d, *files])
    master, slave = pty.openpty()
    proc = sp.Popen(
        [
            str(Path(sys.executable).parent / "stackflow"),
            "apply",
            "-f",
            str(spec),
            "-p",
            project,
            "--yes",
            "--max-concurrency",
            "4",
        ],
        env={**env, "COLUMNS": "200", "TERM": "xterm"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(master)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "/300" in text, "the progress bar counted the nodes"
    assert "ETA " in text, text[-3000:]
    assert len(list(root.iterdir())) == 299


def test_kubernetes_rollback_exclude_and_target(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess, kubeconfig: str
) -> None:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from tests.integration.kubehelp import (
        api_client,
        config_map,
        delete_quietly,
        kusion_id,
        namespace,
        resource,
        suffix,
    )

    env, project, ns = stack_env, new_project(), f"sf-{suffix()}"
    ns_obj = namespace(ns)
    ns_id = kusion_id(ns_obj)

    def spec(name: str, a: str, b: str | None) -> Path:
        items = [resource(ns_obj), resource(config_map(ns, "a", {"v": a}), deps=[ns_id])]
        if b is not None:
            items.append(resource(config_map(ns, "b", {"v": b}), deps=[ns_id]))
        return write_spec(tmp_path / name, items)

    api = api_client(kubeconfig)
    core = k8s.CoreV1Api(api)

    def data(name: str) -> dict[str, str] | None:
        try:
            return dict(core.read_namespaced_config_map(name, ns).data or {})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    try:
        _apply(env, spec("one.yaml", "1", None), project)
        _apply(env, spec("two.yaml", "2", "2"), project)
        assert (data("a"), data("b")) == ({"v": "2"}, {"v": "2"})

        rolled = cli_json(
            _ok(run_cli(env, "rollback", "-p", project, "--to", "1", "--yes", "-o", "json"))
        )
        assert rolled["phase"] == "succeeded" and rolled["operation"] == "rollback"
        assert (data("a"), data("b")) == ({"v": "1"}, None)
        latest = all_releases(env, project)[-1]
        assert (latest.operation, latest.source_revision) == ("rollback", 1)

        applied = _apply(env, spec("three.yaml", "3", "3"), project, "--exclude", "*:b")
        assert applied["changes"]["left_out"]["resources"] == [
            {"id": f"v1:ConfigMap:{ns}:b", "reason": "excluded"}
        ]
        assert (data("a"), data("b")) == ({"v": "3"}, None)

        _apply(env, spec("four.yaml", "4", "4"), project, "--target", "*:b")
        assert (data("a"), data("b")) == ({"v": "3"}, {"v": "4"})
        recorded = {r.id: r for r in all_releases(env, project)[-1].state.resources}
        assert recorded[f"v1:ConfigMap:{ns}:a"].attributes["data"] == {"v": "3"}
    finally:
        delete_quietly(api, namespaces=[ns])
        api.close()  # type: ignore[no-untyped-call]
