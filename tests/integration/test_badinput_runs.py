"""The bad-input corpus, end to end through `stackflow apply` and a real worker: options,
manifests the API server rejects, Terraform arguments OpenTofu rejects, OnPrem attributes,
an unreachable cluster. Each case ends quickly with its exit code (2 bad input, 1 for
infrastructure), one clear error line naming the resource and field, no traceback, and no
stack left locked. (The spec files of tests/badinput are the rest of the corpus: every one
is refused by `apply` before a run starts, also checked here.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stackflow.core.refs import StackRef
from stackflow.state.backend import open_backend
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.opshelp import new_project, write_spec

BAD_SPECS = Path(__file__).resolve().parents[1] / "badinput"
RANDOM = "registry.terraform.io/hashicorp/random/3.6.0"
NS = "default"


def k8s(kind: str, name: str, api: str = "v1", **fields: Any) -> dict[str, Any]:
    group = api.rsplit("/", 1)[0] + "/" if "/" in api else ""
    return {
        "id": f"{group}{api.rsplit('/', 1)[-1]}:{kind}:{NS}:{name}",
        "type": "Kubernetes",
        "attributes": {
            "apiVersion": api,
            "kind": kind,
            "metadata": {"name": name, "namespace": NS},
            **fields,
        },
    }


def deployment(name: str, replicas: Any, **spec: Any) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    }
    body = {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}
    return k8s("Deployment", name, "apps/v1", spec={**body, **spec})


def tf(name: str, resource_type: str, **attributes: Any) -> dict[str, Any]:
    return {
        "id": f"hashicorp:random:{resource_type}:{name}",
        "type": "Terraform",
        "attributes": attributes,
        "extensions": {"provider": RANDOM, "resourceType": resource_type},
    }


def onprem(tmp: Path, **attributes: Any) -> dict[str, Any]:
    path = attributes.get("path", str(tmp / "f"))
    return {
        "id": f"onprem:File:{path}",
        "type": "OnPrem",
        "attributes": {"kind": "File", "path": path, "content": "x\n", **attributes},
    }


# name -> (resources builder, extra CLI args, exit code, fragments of the error line)
CASES: dict[str, tuple[Any, tuple[str, ...], int, tuple[str, ...]]] = {
    # ---- options
    "max-concurrency-zero": (
        lambda t: [onprem(t)],
        ("--max-concurrency", "0"),
        2,
        ("--max-concurrency", "greater than or equal to 1"),
    ),
    "max-concurrency-huge": (
        lambda t: [onprem(t)],
        ("--max-concurrency", "100000"),
        2,
        ("--max-concurrency", "less than or equal to 500"),
    ),
    "ignore-field-empty-segment": (
        lambda t: [onprem(t)],
        ("--ignore-field", "a..b"),
        2,
        ("--ignore-field", "a..b"),  # the option that set it, as for every refused field
    ),
    "unavailable-timeout-negative": (
        lambda t: [onprem(t)],
        ("--unavailable-timeout", "-1"),
        2,
        ("--unavailable-timeout", "greater than 0"),
    ),
    "project-with-space": (lambda t: [onprem(t)], ("--project", "bad name"), 2, ("project",)),
    "missing-spec-file": (None, ("-f", "/nonexistent/spec.yaml"), 2, ("/nonexistent/spec.yaml",)),
    # ---- manifests the API server rejects
    "replicas-as-string": (
        lambda t: [deployment("web", "1")],
        (),
        2,
        ("apps/v1:Deployment:default:web", ".spec.replicas", "expected numeric"),
    ),
    "unknown-kind": (
        lambda t: [k8s("ConfigMapp", "x", data={"a": "b"})],
        (),
        2,
        ("v1:ConfigMapp:default:x", "ConfigMapp"),
    ),
    "unknown-api-version": (
        lambda t: [deployment("web2", 1) | {"id": "apps/v9:Deployment:default:web2"}],
        (),
        2,
        ("apps",),
    ),
    "uppercase-name": (
        lambda t: [k8s("ConfigMap", "Bad_Name", data={"a": "b"})],
        (),
        2,
        ("v1:ConfigMap:default:Bad_Name", "metadata.name"),
    ),
    "non-ascii-name": (
        lambda t: [k8s("ConfigMap", "café-menü", data={"a": "b"})],
        (),
        2,
        ("RFC 1123",),
    ),
    "configmap-data-not-a-string": (
        lambda t: [k8s("ConfigMap", "cm-int", data={"a": 5})],
        (),
        2,
        ("v1:ConfigMap:default:cm-int", "data"),
    ),
    "service-port-out-of-range": (
        lambda t: [k8s("Service", "svc", spec={"ports": [{"port": 70000}]})],
        (),
        2,
        ("v1:Service:default:svc", "port"),
    ),
    "deployment-without-selector": (
        lambda t: [
            k8s(
                "Deployment",
                "nosel",
                "apps/v1",
                spec={"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
            )
        ],
        (),
        2,
        ("apps/v1:Deployment:default:nosel", "selector"),
    ),
    "unknown-field": (
        lambda t: [k8s("ConfigMap", "cm-extra", data={"a": "b"}, dataa={"x": "y"})],
        (),
        2,
        ("v1:ConfigMap:default:cm-extra", "dataa"),
    ),
    "missing-namespace": (
        lambda t: [
            k8s("ConfigMap", "orphan", data={"a": "b"})
            | {
                "id": "v1:ConfigMap:no-such-ns-xyz:orphan",
                "attributes": {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "orphan", "namespace": "no-such-ns-xyz"},
                },
            }
        ],
        (),
        2,
        ("v1:ConfigMap:no-such-ns-xyz:orphan", "no-such-ns-xyz"),
    ),
    # ---- Terraform arguments OpenTofu rejects
    "tf-unknown-argument": (
        lambda t: [tf("pw", "random_password", length=8, lenght=9)],
        (),
        2,
        ("hashicorp:random:random_password:pw", "lenght"),
    ),
    "tf-wrong-type": (
        lambda t: [tf("pw2", "random_password", length="long")],
        (),
        2,
        ("hashicorp:random:random_password:pw2", "length"),
    ),
    "tf-missing-required": (
        lambda t: [tf("pw3", "random_password")],
        (),
        2,
        ("hashicorp:random:random_password:pw3", "length"),
    ),
    "tf-unknown-resource-type": (
        lambda t: [tf("nope", "random_nothing")],
        (),
        2,
        ("hashicorp:random:random_nothing:nope", "random_nothing"),
    ),
    # ---- OnPrem attributes
    "onprem-relative-path": (
        lambda t: [onprem(t, path="relative/file")],
        (),
        2,
        ("path", "absolute"),
    ),
    "onprem-bad-mode": (lambda t: [onprem(t, mode="999")], (), 2, ("mode",)),
    "onprem-unknown-attribute": (lambda t: [onprem(t, owner="root")], (), 2, ("owner",)),
    # ---- infrastructure that cannot be reached
    "unreachable-cluster": (
        lambda t: [
            k8s("ConfigMap", "far", data={"a": "b"})
            | {"extensions": {"kubeConfig": str(t / "unreachable.kubeconfig")}}
        ],
        ("--unavailable-timeout", "5"),
        1,
        ("v1:ConfigMap:default:far", "127.0.0.1:1", "unavailable_timeout of 5s"),
    ),
}

UNREACHABLE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "far", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "x"}}],
    "contexts": [{"name": "far", "context": {"cluster": "far", "user": "u"}}],
    "current-context": "far",
}


@pytest.fixture
def stack_env(stack_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The worker policy allows the unreachable cluster's kubeconfig the corpus writes."""
    stack_env["STACKFLOW_ALLOWED_KUBECONFIGS"] = str(tmp_path / "unreachable.kubeconfig")
    return stack_env


def assert_one_clean_line(proc: Any, code: int, fragments: tuple[str, ...]) -> str:
    err = proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{err}"
    assert "Traceback" not in err + proc.stdout
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, lines
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_run(
    case: str,
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    kubeconfig: str,
) -> None:
    build, extra, code, fragments = CASES[case]
    (tmp_path / "unreachable.kubeconfig").write_text(yaml.safe_dump(UNREACHABLE_KUBECONFIG))
    project = new_project()
    args = ["apply", "--yes", "--project", project, *extra]
    if build is not None:
        args[1:1] = ["-f", str(write_spec(tmp_path / "spec.yaml", build(tmp_path)))]
    started = time.monotonic()
    proc = run_cli(stack_env, *args, timeout=120)
    took = time.monotonic() - started
    assert_one_clean_line(proc, code, fragments)
    assert took < (5 + 30 if case == "unreachable-cluster" else 30), f"took {took:.0f}s"
    backend = open_backend(stack_env["STACKFLOW_STATE_URL"])
    try:
        assert backend.lock(StackRef(project, "default")) is None, "stack left locked"
        latest = backend.latest(StackRef(project, "default"), with_spec=False)
        assert latest is None or latest.phase in ("failed", "succeeded")
    finally:
        backend.close()


@pytest.mark.parametrize("path", sorted(BAD_SPECS.iterdir()), ids=lambda p: p.name)
def test_bad_spec_files_never_start_a_run(path: Path, stack_env: dict[str, str]) -> None:
    project = new_project()
    proc = run_cli(stack_env, "apply", "-f", str(path), "--yes", "--project", project)
    assert_one_clean_line(proc, 2, (str(path),))
    backend = open_backend(stack_env["STACKFLOW_STATE_URL"])
    try:
        assert backend.revisions(StackRef(project, "default")) == []
    finally:
        backend.close()
