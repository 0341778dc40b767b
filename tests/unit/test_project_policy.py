"""Per-project sections of the worker policy (stackflow/runtimes/policy.py ``projects:``), the
Kubernetes namespaces and kinds, and Terraform arguments that name files on the worker,
whatever the resource type (stackflow/runtimes/terraform/policy.py), with real files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from stackflow.runtimes.file_roots import onprem_target
from stackflow.runtimes.kubernetes.policy import check_kubeconfig, check_object
from stackflow.runtimes.onprem import OnPremRuntime
from stackflow.runtimes.policy import (
    PolicyConfigError,
    PolicyViolation,
    WorkerPolicy,
    glob_covers,
    load_policy,
)
from stackflow.runtimes.terraform.policy import check_terraform, worker_paths

RID = "r:1"


def policy(tmp_path: Path, doc: dict[str, Any] | None = None, **env: str) -> WorkerPolicy:
    base = {"HOME": str(tmp_path / "user"), "STACKFLOW_HOME": str(tmp_path / "sfhome")}
    if doc is not None:
        file = tmp_path / "policy.yaml"
        file.write_text(yaml.safe_dump(doc, sort_keys=False))
        base["STACKFLOW_POLICY_FILE"] = str(file)
    return load_policy({**base, **env})


def refused(fn: Any, *args: Any, **kwargs: Any) -> PolicyViolation:
    with pytest.raises(PolicyViolation) as err:
        fn(*args, **kwargs)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{RID}: {err.value.field}: ")
    return err.value


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "srv" / "a", tmp_path / "srv" / "b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    return a, b


def scoped(tmp_path: Path, roots: tuple[Path, Path]) -> WorkerPolicy:
    a, b = roots
    return policy(
        tmp_path,
        {
            "onprem": {"roots": [str(a.parent)]},
            "kubernetes": {"allowed_contexts": ["kind-*"]},
            "projects": {
                "team-a*": {
                    "onprem": {"roots": [str(a)], "max_bytes": "1KiB"},
                    "kubernetes": {
                        "allowed_contexts": ["kind-a"],
                        "allowed_namespaces": ["team-a", "team-a-*"],
                        "allowed_kinds": ["ConfigMap", "apps/*"],
                    },
                    "terraform": {"allowed_providers": ["hashicorp/null"]},
                },
                "team-b": {"onprem": {"roots": [str(b)]}},
                "shared": None,
            },
        },
    )


# ---- loading and choosing --------------------------------------------------------------------
def test_each_project_gets_its_sections_policy_and_others_are_denied(
    tmp_path: Path, roots: tuple[Path, Path]
) -> None:
    a, b = roots
    p = scoped(tmp_path, roots)
    team_a = p.for_project("team-a-web", RID)
    assert team_a.onprem.roots == (str(a),) and int(team_a.onprem.max_bytes) == 1024
    assert team_a.terraform.allowed_providers == ("hashicorp/null",)
    assert team_a.kubernetes.allowed_contexts == ("kind-a",)
    assert p.for_project("team-a-web", RID) is team_a  # one object: memos keyed by it hold
    assert p.for_project("team-b", RID).onprem.roots == (str(b),)
    shared = p.for_project("shared", RID)
    assert shared.onprem.roots == p.onprem.roots and shared.protected == p.protected
    err = refused(p.for_project, "team-c", RID)
    assert err.field == "project" and "'team-c'" in str(err) and "team-a*" in str(err)
    # the worker's protected paths stay protected for every project
    assert team_a.protected == p.protected
    # no sections: every project has the worker's policy, as before
    plain = policy(tmp_path, STACKFLOW_ONPREM_ROOTS=str(a))
    assert plain.for_project("anything", RID) is plain


def test_the_summary_prints_each_section(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    a, _ = roots
    line = scoped(tmp_path, roots).summary()
    assert "\n" not in line
    assert "team-a* (terraform.allowed_providers=hashicorp/null;" in line
    assert f"onprem.roots={a}" in line and "shared (as the worker)" in line
    assert line.endswith("any other denied")
    assert policy(tmp_path).summary().endswith("projects: all alike")


def test_the_first_matching_glob_wins(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    a, _b = roots
    p = policy(
        tmp_path,
        {
            "onprem": {"roots": [str(a.parent)]},
            "projects": {"pay*": {"onprem": {"roots": [str(a)]}}, "*": {}},
        },
    )
    assert p.for_project("payments", RID).onprem.roots == (str(a),)
    assert p.for_project("web", RID).onprem.roots == (str(a.parent),)


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ({"onprem": {"roots": ["/etc"]}}, "projects.p.onprem.roots: /etc is outside the worker's"),
        ({"onprem": {"max_bytes": "2MiB"}}, "projects.p.onprem.max_bytes: 2097152 is more"),
        ({"terraform": {"allowed_providers": ["*"]}}, "projects.p.terraform.allowed_providers:"),
        ({"terraform": {"allow_provisioners": True}}, "terraform.allow_provisioners: is off"),
        ({"kubernetes": {"allowed_contexts": ["prod"]}}, "'prod' is not within the worker's"),
        ({"kubernetes": {"allowed_contexts": None}}, "any is wider than the worker's"),
        ({"kubernetes": {"allow_exec": True}}, "kubernetes.allow_exec: is off"),
        ({"kubernetes": {"allowed_kubeconfigs": ["/etc/k.yaml"]}}, "/etc/k.yaml is outside"),
        ({"approvals": {"four_eyes": ["p"]}}, "projects.p.approvals: not a section a project"),
        ({"terraform": {"remote_path_arguments": ["*"]}}, "applies to the whole worker"),
        ({"onprem": {"rots": ["/x"]}}, "projects.p.onprem.rots: not a setting"),
        ({"onprem": {"roots": "relative"}}, "projects.p.onprem.roots"),
        ({"nomad": {}}, "projects.p.nomad: not a section"),
    ],
)
def test_a_section_wider_than_the_worker_stops_it_with_one_line(
    tmp_path: Path, roots: tuple[Path, Path], section: dict[str, Any], fragment: str
) -> None:
    a, _ = roots
    worker = {
        "onprem": {"roots": [str(a)]},
        "kubernetes": {"allowed_contexts": ["kind-*"], "allowed_kubeconfigs": [str(a)]},
    }
    with pytest.raises(PolicyConfigError) as err:
        policy(tmp_path, {**worker, "projects": {"p": section}})
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"worker policy: {tmp_path / 'policy.yaml'}: projects.p.")


def test_projects_must_be_a_mapping(tmp_path: Path) -> None:
    for bad in ([], {}, "team-a"):
        with pytest.raises(PolicyConfigError, match="projects must map project globs"):
            policy(tmp_path, {"projects": bad})


@pytest.mark.parametrize(
    ("outer", "inner", "covered"),
    [
        ("*", "anything/*", True),
        ("hashicorp/*", "hashicorp/null", True),
        ("hashicorp/*", "hashicorp/n*", True),
        ("hashicorp/*", "hashi*/null", False),
        ("hashicorp/*", "*", False),
        ("a?", "a*", False),
        ("team-*", "team-a", True),
        ("team-*", "team-[ab]", True),
        ("team-a", "team-a", True),
        ("team-a", "team-?", False),
    ],
)
def test_glob_coverage_is_sound(outer: str, inner: str, covered: bool) -> None:
    assert glob_covers(outer, inner) is covered


# ---- each runtime under a project's section ---------------------------------------------------
def test_onprem_paths_of_a_project_stay_in_its_roots(
    tmp_path: Path, roots: tuple[Path, Path]
) -> None:
    a, b = roots
    p = scoped(tmp_path, roots)
    onprem_target(p.for_project("team-a", RID), RID, str(a / "f"))
    onprem_target(p.for_project("team-b", RID), RID, str(b / "f"))
    err = refused(onprem_target, p.for_project("team-a", RID), RID, str(b / "f"))
    assert "outside this worker's OnPrem roots" in str(err) and str(a) in str(err)


async def test_the_onprem_runtime_uses_the_runs_project(
    tmp_path: Path, roots: tuple[Path, Path]
) -> None:
    _a, b = roots
    rt = OnPremRuntime(scoped(tmp_path, roots))
    req = ResourceRequest(
        id=RID, type="OnPrem", attributes={"kind": "File", "path": str(b / "f"), "content": "x"}
    )
    team_b, team_a = (
        RuntimeOptions(project="team-b", workspace="w"),
        RuntimeOptions(project="team-a", workspace="w"),
    )
    await rt.apply(req, team_b)
    assert (b / "f").read_text() == "x"
    for call in (rt.apply, rt.read, rt.delete):
        with pytest.raises(PolicyViolation, match="outside this worker's OnPrem roots"):
            await call(req, team_a)
    with pytest.raises(PolicyViolation, match="has no section"):
        rt.check_policy(req, RuntimeOptions(project="team-z", workspace="w"))
    assert (b / "f").read_text() == "x"


def configmap(namespace: str | None, kind: str = "ConfigMap", api: str = "v1") -> dict[str, Any]:
    meta = {"name": "n"} if namespace is None else {"name": "n", "namespace": namespace}
    return {"apiVersion": api, "kind": kind, "metadata": meta}


def test_kubernetes_namespaces_and_kinds(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    p = scoped(tmp_path, roots).for_project("team-a", RID)
    check_object(p, RID, configmap("team-a"))
    check_object(p, RID, configmap("team-a-dev"))
    check_object(p, RID, configmap("team-a", "Deployment", "apps/v1"))
    err = refused(check_object, p, RID, configmap("team-b"))
    assert err.field == "attributes.metadata.namespace" and "'team-b'" in str(err)
    err = refused(check_object, p, RID, configmap("team-a", "Secret"))
    assert err.field == "attributes.kind" and "core/Secret" in str(err)
    err = refused(check_object, p, RID, configmap("team-a", "Deployment", "evil.io/v1"))
    assert err.field == "attributes.kind" and "evil.io/Deployment" in str(err)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}
    assert refused(check_object, p, RID, ns).field == "attributes.kind"
    wide = p.model_copy(
        update={"kubernetes": p.kubernetes.model_copy(update={"allowed_kinds": None})}
    )
    check_object(wide, RID, {**ns, "metadata": {"name": "team-a-dev"}})  # its own namespace
    assert refused(check_object, wide, RID, ns).field == "attributes.metadata.name"
    err = refused(
        check_object, wide, RID, configmap(None, "ClusterRole", "rbac.authorization.k8s.io/v1")
    )
    assert "cluster-scoped" in str(err)
    # no namespaces or kinds set (the worker's own policy): anything
    check_object(scoped(tmp_path, roots), RID, configmap(None, "ClusterRole"))


def test_a_project_may_be_kept_off_the_workers_own_kubeconfig(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "contexts": []}))
    team = tmp_path / "kube" / "team.yaml"
    team.parent.mkdir()
    team.write_text(own.read_text())
    p = policy(
        tmp_path,
        {
            "kubernetes": {"allowed_kubeconfigs": [str(team.parent)]},
            "projects": {
                "a": {
                    "kubernetes": {"worker_kubeconfig": False, "allowed_kubeconfigs": [str(team)]}
                }
            },
        },
        KUBECONFIG=str(own),
    )
    fields = {"config_field": "extensions.kubeConfig", "context_field": "extensions.kubeContext"}
    scoped_a = p.for_project("a", RID)
    check_kubeconfig(scoped_a, RID, str(team), None, **fields)
    err = refused(check_kubeconfig, scoped_a, RID, None, None, **fields)
    assert "the worker's own" in str(err)
    refused(check_kubeconfig, scoped_a, RID, str(own), None, **fields)
    check_kubeconfig(p, RID, None, None, **fields)  # the worker's policy: still allowed


# ---- Terraform arguments naming files on the worker ------------------------------------------
def tf(p: WorkerPolicy, resource_type: str, arguments: dict[str, Any], name: str = "aws") -> None:
    check_terraform(
        p,
        RID,
        provider_source=f"registry.terraform.io/hashicorp/{name}",
        provider_name=name,
        resource_type=resource_type,
        arguments=arguments,
        provider_meta={},
    )


@pytest.mark.parametrize(
    ("resource_type", "arguments", "field", "fragment"),
    [
        (
            "aws_s3_object",
            {"bucket": "b", "key": "k", "source": "/etc/passwd"},
            "source",
            "outside",
        ),
        ("aws_lambda_function", {"filename": "/proc/1/environ"}, "filename", "outside"),
        ("terraform_data", {"input": "/proc/1/environ"}, "input", "outside"),
        ("terraform_data", {"input": "/proc/self/../1/environ"}, "input", "outside"),
        ("terraform_data", {"input": ["ok", {"x": "/dev/fd/3"}]}, "input[1].x", "outside"),
        ("aws_s3_object", {"source": "~/.aws/credentials"}, "source", "home directory"),
        ("aws_s3_object", {"content": "~root/.ssh/id_rsa"}, "content", "home directory"),
        ("aws_s3_object", {"source": "./terraform.tfstate"}, "source", "relative"),
        ("aws_s3_object", {"source": "terraform.tfstate"}, "source", "absolute path"),
        ("aws_s3_object", {"etag": "../x"}, "etag", "relative"),
        ("http_thing", {"url": "file:///etc/shadow"}, "url", "outside"),
        ("aws_iot_certificate", {"ca_pem_file": "/root/.ssh/id_rsa"}, "ca_pem_file", "outside"),
        ("local_file", {"filename": "relative.txt"}, "filename", "absolute path"),
    ],
)
def test_an_argument_naming_a_worker_file_is_confined_whatever_the_type(
    tmp_path: Path, resource_type: str, arguments: dict[str, Any], field: str, fragment: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    p = policy(tmp_path, STACKFLOW_ONPREM_ROOTS=str(root))
    name = resource_type.split("_", 1)[0]
    if name == "terraform":
        check = lambda: check_terraform(  # noqa: E731
            p,
            RID,
            provider_source="terraform.io/builtin/terraform",
            provider_name="terraform",
            resource_type=resource_type,
            arguments=arguments,
            provider_meta={},
        )
    else:
        check = lambda: tf(p, resource_type, arguments, name)  # noqa: E731
    err = refused(check)
    assert err.field == f"attributes.{field}" and fragment in str(err), str(err)


def test_arguments_that_name_no_worker_file_pass(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    p = policy(tmp_path, STACKFLOW_ONPREM_ROOTS=str(root))
    tf(p, "aws_s3_object", {"source": str(root / "site" / "index.html")})  # inside the roots
    tf(p, "aws_s3_object", {"source": "$kusion_path.a:b:c:d.path"})  # checked once resolved
    tf(p, "aws_iam_role", {"path": "/service-role/", "name": "r"})
    tf(p, "aws_lb_target_group", {"health_check": [{"path": "/healthz"}]})
    tf(p, "aws_instance", {"ebs_block_device": [{"device_name": "/dev/sdh"}]})
    tf(p, "aws_s3_object", {"source": "s3://bucket/key", "content": "~> 1.0"})
    tf(p, "aws_cloudformation_stack", {"template_url": "https://x/t.json"})
    tf(p, "archive_file", {"source": [{"filename": "a.txt", "content": "x"}]}, "archive")
    tf(p, "github_repository_file", {"file": "README.md"}, "github")
    kube = {"spec": [{"container": [{"volume_mount": [{"mount_path": "/data"}]}]}]}
    tf(p, "kubernetes_deployment", kube, "kubernetes")


def test_remote_path_arguments_are_the_workers_own_exceptions(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    p = policy(tmp_path, STACKFLOW_ONPREM_ROOTS=str(root))
    refused(tf, p, "vendor_blob", {"upload": [{"file": "/remote/x"}]}, "vendor")
    excepted = policy(
        tmp_path,
        {"terraform": {"remote_path_arguments": ["vendor_blob.upload.file"]}},
        STACKFLOW_ONPREM_ROOTS=str(root),
    )
    tf(excepted, "vendor_blob", {"upload": [{"file": "/remote/x"}]}, "vendor")
    assert [f for f, _, _ in worker_paths("vendor_blob", {"upload": [{"file": "/x"}]})] == [
        "attributes.upload[0].file"
    ]


def test_the_worker_users_credentials_are_never_a_path_inside_a_root(tmp_path: Path) -> None:
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    p = policy(tmp_path, STACKFLOW_ONPREM_ROOTS=str(tmp_path))  # the root holds the home
    err = refused(tf, p, "aws_s3_object", {"source": str(home / ".ssh" / "id_ed25519")})
    assert "the worker user's credentials" in str(err)
    err = refused(onprem_target, p, RID, str(home / ".aws" / "credentials"))
    assert "the worker user's credentials" in str(err)
