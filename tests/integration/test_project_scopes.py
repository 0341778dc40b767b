"""Projects scoped on the infrastructure side, end to end through the real CLI and a real
worker on the dev services (kube-apiserver with kwok, OpenTofu with the offline providers,
local files, PostgreSQL).

One worker (module scope) has a policy file with two project sections: project A's runs
may only write files under ``<root>/a``, only ConfigMaps in its namespace and only the
``hashicorp/null`` provider; project B's only files under ``<root>/b``; any other project is
denied. An operator of A trying to reach out of A's scope is refused at preview with one
line, exit 2, before anything runs; an OnPrem path another stack recorded is refused with
exit 3 (also when two stacks apply it at once); and a worker whose project section is wider
than its own policy refuses to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from stackflow.core.refs import StackRef
from stackflow.state.backend import open_backend
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.kubehelp import api_client, config_map, delete_quietly, resource
from tests.integration.opshelp import file_resource

BUILTIN = "terraform.io/builtin/terraform"


@dataclass
class Scopes:
    root: Path
    env: dict[str, str]
    a: str
    """Project A's glob prefix: its projects are ``<a>-<anything>``."""
    b: str
    namespace: str
    """Project A's only namespace (it exists)."""

    def project(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def scopes(
    tmp_path_factory: pytest.TempPathFactory,
    temporal_address: str,
    redis_url: str,
    integration_postgres_url: str,
    kubeconfig: str,
    tf_bin: str,
) -> Iterator[Scopes]:
    root = tmp_path_factory.mktemp("scopes")
    for name in ("a", "b", "home"):
        (root / name).mkdir()
    tag = uuid.uuid4().hex[:6]
    a, b, namespace = f"sa{tag}", f"sb{tag}", f"team-a-{tag}"
    policy = {
        "onprem": {"roots": [str(root)]},
        "projects": {
            f"{a}-*": {
                "onprem": {"roots": [str(root / "a")]},
                "kubernetes": {"allowed_namespaces": [namespace], "allowed_kinds": ["ConfigMap"]},
                "terraform": {"allowed_providers": ["hashicorp/null"]},
            },
            f"{b}-*": {"onprem": {"roots": [str(root / "b")]}},
        },
    }
    policy_file = root / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy, sort_keys=False))
    env = dict(os.environ)
    for name in [k for k in env if k.startswith(("STACKFLOW_ALLOW", "STACKFLOW_ONPREM"))]:
        env.pop(name)
    env.pop("STACKFLOW_TF_PASS_ENV", None)
    env.update(
        STACKFLOW_HOME=str(root / "home"),
        STACKFLOW_STATE_URL=integration_postgres_url,
        STACKFLOW_TASK_QUEUE=f"scopes-{tag}",
        STACKFLOW_POLICY_FILE=str(policy_file),
        TEMPORAL_ADDRESS=temporal_address,
        REDIS_URL=redis_url,
        PYTHONPATH=str(REPO),
        KUBECONFIG=kubeconfig,
    )
    api = api_client(kubeconfig)
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    worker = WorkerProcess(root, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    try:
        yield Scopes(root=root, env=env, a=a, b=b, namespace=namespace)
    finally:
        worker.stop()
        delete_quietly(api, namespaces=[namespace])
        api.close()  # type: ignore[no-untyped-call]


def write_spec(scopes: Scopes, resources: list[dict[str, Any]]) -> Path:
    path = scopes.root / "specs" / f"{uuid.uuid4().hex[:8]}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"resources": resources}, sort_keys=False))
    return path


def terraform_data(name: str, value: Any) -> dict[str, Any]:
    return {
        "id": f"builtin:terraform:terraform_data:{name}",
        "type": "Terraform",
        "attributes": {"input": value},
        "extensions": {"provider": BUILTIN},
    }


def tf(provider: str, version: str, rtype: str, name: str, attrs: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"hashicorp:{provider}:{rtype}:{name}",
        "type": "Terraform",
        "attributes": attrs,
        "extensions": {"provider": f"registry.terraform.io/hashicorp/{provider}/{version}"},
    }


def one_error(proc: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode} (wanted {code})\n{out}"
    assert "Traceback" not in out
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def nothing_recorded(scopes: Scopes, project: str) -> None:
    backend = open_backend(scopes.env["STACKFLOW_STATE_URL"])
    try:
        stack = StackRef(project, "default")
        assert backend.lock(stack) is None
        latest = backend.latest(stack, with_spec=False)
        assert latest is None or latest.state.resources == []
    finally:
        backend.close()


# ---- an operator of A cannot reach out of A's scope: refused at preview, exit 2 -------------
Build = Callable[[Scopes], list[dict[str, Any]]]
CASES: dict[str, tuple[Build, tuple[str, ...]]] = {
    "onprem-path-of-b": (
        lambda s: [file_resource(s.root / "b" / "planted.txt", "x\n")],
        ("onprem:File:", "attributes.path", "outside this worker's OnPrem roots"),
    ),
    "onprem-path-of-the-worker-root": (
        lambda s: [file_resource(s.root / "top.txt", "x\n")],
        ("attributes.path", "outside this worker's OnPrem roots"),
    ),
    "kube-namespace-of-another-team": (
        lambda s: [resource(config_map("default", "cm", {"a": "b"}))],
        ("v1:ConfigMap:default:cm", "attributes.metadata.namespace", "'default'"),
    ),
    "kube-kind-not-allowed": (
        lambda s: [
            resource(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "s", "namespace": s.namespace},
                    "stringData": {"k": "v"},
                }
            )
        ],
        ("attributes.kind", "core/Secret is not a kind this project may manage"),
    ),
    "kube-cluster-scoped": (
        lambda s: [resource({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})],
        ("attributes.kind",),
    ),
    "tf-provider-not-allowed": (
        lambda s: [tf("random", "3.6.0", "random_id", "r", {"byte_length": 4})],
        ("hashicorp:random:random_id:r", "extensions.provider", "hashicorp/null"),
    ),
    "tf-proc-in-any-argument": (
        lambda s: [terraform_data("leak", "/proc/1/environ")],
        ("builtin:terraform:terraform_data:leak", "attributes.input", "/proc/1/environ"),
    ),
    "tf-source-outside-the-roots": (
        lambda s: [
            tf("null", "2.1.2", "null_resource", "up", {"triggers": {"source": "/etc/passwd"}})
        ],
        ("attributes.triggers.source", "/etc/passwd is outside"),
    ),
    "tf-file-of-b": (
        lambda s: [terraform_data("b", {"source_file": str(s.root / "b" / "x")})],
        ("attributes.input.source_file", "outside this worker's OnPrem roots"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_operator_of_a_cannot_reach_out_of_as_scope(name: str, scopes: Scopes) -> None:
    build, fragments = CASES[name]
    project = scopes.project(scopes.a)
    spec = write_spec(scopes, build(scopes))
    proc = run_cli(scopes.env, "preview", "-f", str(spec), "--project", project, timeout=120)
    print(one_error(proc, 2, *fragments))
    apply = run_cli(scopes.env, "apply", "-f", str(spec), "--project", project, "--yes")
    one_error(apply, 2, *fragments)
    nothing_recorded(scopes, project)
    assert not (scopes.root / "b" / "planted.txt").exists()
    assert not (scopes.root / "top.txt").exists()
    assert not (scopes.root / "home" / "terraform").exists(), "a Terraform working dir was made"


def test_inside_its_scope_a_applies(scopes: Scopes) -> None:
    project = scopes.project(scopes.a)
    spec = write_spec(
        scopes,
        [
            file_resource(scopes.root / "a" / f"{project}.txt", "mine\n"),
            resource(config_map(scopes.namespace, project, {"a": "b"})),
            tf("null", "2.1.2", "null_resource", "ok", {"triggers": {"k": "v"}}),
        ],
    )
    proc = run_cli(scopes.env, "apply", "-f", str(spec), "--project", project, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (scopes.root / "a" / f"{project}.txt").read_text() == "mine\n"
    proc = run_cli(scopes.env, "destroy", "--project", project, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_project_no_section_names_is_denied(scopes: Scopes) -> None:
    project = f"other-{uuid.uuid4().hex[:6]}"
    spec = write_spec(scopes, [file_resource(scopes.root / "b" / "c.txt", "x\n")])
    proc = run_cli(scopes.env, "preview", "-f", str(spec), "--project", project)
    one_error(proc, 2, "project: ", f"project {project!r} has no section", scopes.a)
    nothing_recorded(scopes, project)
    # the worker said so at start, in its policy line
    log = (scopes.root / f"worker-{scopes.env['STACKFLOW_TASK_QUEUE']}.log").read_text()
    [line] = [x for x in log.splitlines() if x.startswith("stackflow worker policy: ")]
    assert f"projects: {scopes.a}-* (terraform.allowed_providers=hashicorp/null;" in line
    assert line.endswith("any other denied")


# ---- an OnPrem path belongs to one stack: exit 3 --------------------------------------------
def test_a_path_another_stack_recorded_is_refused_until_it_gives_it_up(scopes: Scopes) -> None:
    owner, other = scopes.project(scopes.b), scopes.project(scopes.b)
    target = scopes.root / "b" / f"shared-{owner}.conf"
    mine = write_spec(scopes, [file_resource(target, "owner's\n")])
    proc = run_cli(scopes.env, "apply", "-f", str(mine), "--project", owner, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # another stack (same scope, other project) may not take the file: preview and apply
    theirs = write_spec(scopes, [file_resource(target, "overwritten\n")])
    fragments = (str(target), f"owned by stack {owner}/default", "OwnedElsewhere")
    preview = run_cli(scopes.env, "preview", "-f", str(theirs), "--project", other)
    one_error(preview, 3, *fragments[:2])
    apply = run_cli(scopes.env, "apply", "-f", str(theirs), "--project", other, "--yes")
    one_error(apply, 3, *fragments[:2])
    assert target.read_text() == "owner's\n"
    # the owner destroys it: the path is free again
    proc = run_cli(scopes.env, "destroy", "--project", owner, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    apply = run_cli(scopes.env, "apply", "-f", str(theirs), "--project", other, "--yes")
    assert apply.returncode == 0, apply.stdout + apply.stderr
    assert target.read_text() == "overwritten\n"
    run_cli(scopes.env, "destroy", "--project", other, "--yes")


def test_of_two_stacks_applying_one_path_at_once_one_wins(scopes: Scopes) -> None:
    projects = [scopes.project(scopes.b) for _ in range(2)]
    target = scopes.root / "b" / f"race-{projects[0]}.conf"
    specs = [write_spec(scopes, [file_resource(target, f"{p}\n")]) for p in projects]
    stackflow = str(REPO / ".venv" / "bin" / "stackflow")
    procs = [
        subprocess.Popen(
            [stackflow, "apply", "-f", str(spec), "--project", project, "--yes"],
            env=scopes.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec, project in zip(specs, projects, strict=True)
    ]
    results = [proc.communicate(timeout=300) for proc in procs]
    codes = [proc.returncode for proc in procs]
    assert sorted(codes) == [0, 3], results
    winner = projects[codes.index(0)]
    loser = projects[codes.index(3)]
    assert target.read_text() == f"{winner}\n"
    assert f"owned by stack {winner}/default" in results[codes.index(3)][1]
    nothing_recorded(scopes, loser)
    run_cli(scopes.env, "destroy", "--project", winner, "--yes")


# ---- the worker refuses to start with a section wider than its own policy --------------------
def test_a_worker_with_a_section_wider_than_its_policy_does_not_start(tmp_path: Path) -> None:
    policy = {
        "onprem": {"roots": [str(tmp_path / "srv")]},
        "projects": {"team-a": {"onprem": {"roots": ["/etc"]}}},
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACKFLOW_")}
    env.update(
        STACKFLOW_POLICY_FILE=str(tmp_path / "policy.yaml"),
        STACKFLOW_HOME=str(tmp_path / "home"),
        PYTHONPATH=str(REPO),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "stackflow.worker"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc  # a worker problem, not a spec's (PolicyConfigError)
    assert proc.stderr.splitlines() == [
        f"Error: worker policy: {tmp_path / 'policy.yaml'}: projects.team-a.onprem.roots: /etc "
        f"is outside the worker's ({tmp_path / 'srv'}) (a project's section may only narrow)"
    ]
