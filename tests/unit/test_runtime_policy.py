"""The worker policy where it is enforced: the activities check a whole spec before any
runtime call and re-check on apply; each runtime checks on every call, before any I/O the
policy does not need; OnPrem files are reached without following symlinks planted after
the check; Terraform templates in keys and import ids stay literal."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.exceptions import ApplicationError

from stackflow.activities import WorkerActivities
from stackflow.core.refs import RunRef
from stackflow.runtimes.base import Attributes, ResourceRequest, Runtime, RuntimeOptions
from stackflow.runtimes.kubernetes import KubernetesRuntime
from stackflow.runtimes.onprem import OnPremRuntime, apply_sync
from stackflow.runtimes.policy import PolicyViolation, WorkerPolicy, load_policy
from stackflow.runtimes.registry import RuntimeRegistry
from stackflow.runtimes.terraform import TerraformRuntime
from stackflow.runtimes.terraform.config import parse_resource, render_config
from stackflow.state.backend import StateBackend
from stackflow.state.cache import PriorStateCache
from stackflow.temporal.activity_io import NodeInput, PrepareInput, PreviewBatchInput
from stackflow.temporal.operation import OperationInput

OPTS = RuntimeOptions(project="p", workspace="w")


def onprem_policy(tmp_path: Path, **env: str) -> WorkerPolicy:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return load_policy(
        {
            "HOME": str(tmp_path / "user"),
            "STACKFLOW_HOME": str(root / "home"),
            "STACKFLOW_ONPREM_ROOTS": str(root),
            "STACKFLOW_ONPREM_MAX_BYTES": "1KiB",
            **env,
        }
    )


def file_request(path: Path | str, content: str = "x\n", kind: str = "File") -> ResourceRequest:
    attributes: dict[str, Any] = {"kind": kind, "path": str(path)}
    if kind == "File":
        attributes["content"] = content
    return ResourceRequest(id=f"onprem:{kind}:{path}", type="OnPrem", attributes=attributes)


# ---- OnPrem ----------------------------------------------------------------------------------
async def test_onprem_lifecycle_inside_a_root(tmp_path: Path) -> None:
    rt = OnPremRuntime(onprem_policy(tmp_path))
    target = tmp_path / "root" / "a" / "b" / "c.txt"
    r = file_request(target, "hello\n")
    assert await rt.read(r, OPTS) is None
    live, preview = await rt.observe(r, OPTS, with_preview=True)
    assert live is None and preview is not None
    want = {"kind": "File", "path": str(target), "mode": "0644", "content": "hello\n"}
    assert preview.would_be == want
    live = await rt.apply(r, OPTS)
    assert live == want
    assert await rt.read(r, OPTS) == live
    assert await rt.observe(r, OPTS, with_preview=False) == (live, None)
    assert sorted(os.listdir(target.parent)) == ["c.txt"]  # no temporary file left
    d = file_request(tmp_path / "root" / "a" / "d", kind="Directory")
    assert (await rt.apply(d, OPTS))["kind"] == "Directory"
    await rt.delete(r, OPTS)
    await rt.delete(d, OPTS)
    assert not target.exists() and not (tmp_path / "root" / "a" / "d").exists()


async def test_a_write_killed_before_its_rename_leaves_nothing_once_retried(
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed between writing the temporary file and renaming it: the retried
    write of the same file reuses the temporary name and leaves only the file."""
    rt = OnPremRuntime(onprem_policy(tmp_path))
    target = tmp_path / "root" / "d" / "f.txt"
    r = file_request(target, "one\n")
    attrs, place = rt._place(r)
    pid = os.fork()
    if pid == 0:  # the worker, killed right before the rename
        os.replace = lambda *a, **k: os._exit(9)  # type: ignore[assignment]
        apply_sync(r.id, attrs, place)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    left = os.listdir(target.parent)
    assert len(left) == 1 and left[0].startswith(".stackflow-")  # what the kill left
    assert (await rt.apply(file_request(target, "two\n"), OPTS))["content"] == "two\n"
    assert os.listdir(target.parent) == ["f.txt"]


async def test_onprem_refusals_touch_nothing(tmp_path: Path) -> None:
    rt = OnPremRuntime(onprem_policy(tmp_path))
    (tmp_path / "outside").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "root" / "escape").symlink_to(tmp_path / "outside" / "x")

    async def observe(r: ResourceRequest, options: RuntimeOptions) -> object:
        return await rt.observe(r, options, with_preview=True)

    for path in (
        tmp_path / "outside" / "x",
        tmp_path / "root" / "link" / "x",
        tmp_path / "root" / "escape",  # the file itself a symlink out of the root
    ):
        for call in (rt.read, rt.preview, observe, rt.apply, rt.delete):
            with pytest.raises(PolicyViolation, match="outside this worker's OnPrem roots"):
                await call(file_request(path), OPTS)
    assert os.listdir(tmp_path / "outside") == []
    with pytest.raises(PolicyViolation, match=r"attributes\.content"):
        await rt.apply(file_request(tmp_path / "root" / "big", "x" * 1025), OPTS)
    assert not (tmp_path / "root" / "big").exists()


async def test_onprem_never_reads_a_large_file(tmp_path: Path) -> None:
    rt = OnPremRuntime(onprem_policy(tmp_path))
    big = tmp_path / "root" / "big.log"
    big.write_bytes(b"s" * 2048)
    with pytest.raises(PolicyViolation, match="2048 bytes"):
        await rt.read(file_request(big), OPTS)
    with pytest.raises(PolicyViolation, match="2048 bytes"):
        await rt.apply(file_request(big), OPTS)
    assert big.read_bytes() == b"s" * 2048
    await rt.delete(file_request(big, "small"), OPTS)  # what is recorded can be deleted
    assert not big.exists()


async def test_onprem_does_not_block_on_a_fifo(tmp_path: Path) -> None:
    rt = OnPremRuntime(onprem_policy(tmp_path))
    fifo = tmp_path / "root" / "fifo"
    os.mkfifo(fifo)
    live = await asyncio.wait_for(rt.read(file_request(fifo), OPTS), 5)
    assert live is not None and live["kind"] == "Other"


def test_a_symlink_planted_after_the_check_is_not_followed(tmp_path: Path) -> None:
    policy = onprem_policy(tmp_path)
    rt = OnPremRuntime(policy)
    (tmp_path / "outside").mkdir()
    sub = tmp_path / "root" / "sub"
    sub.mkdir()
    r = file_request(sub / "planted")
    attrs, place = rt._place(r)  # checked: inside the root
    sub.rename(tmp_path / "root" / "moved")
    sub.symlink_to(tmp_path / "outside")  # swapped in between check and write
    with pytest.raises(PolicyViolation, match="symlink"):
        apply_sync(r.id, attrs, place)
    assert os.listdir(tmp_path / "outside") == []


def test_a_symlink_as_the_file_itself_is_not_written_through(tmp_path: Path) -> None:
    policy = onprem_policy(tmp_path)
    rt = OnPremRuntime(policy)
    inside = tmp_path / "root" / "real.txt"
    inside.write_text("real\n")
    link = tmp_path / "root" / "link.txt"
    link.symlink_to(inside)  # both inside: allowed, but a symlink is not a File
    r = file_request(link, "new\n")
    attrs, place = rt._place(r)
    from stackflow.runtimes.base import Conflict

    with pytest.raises(Conflict, match="exists as a Other"):
        apply_sync(r.id, attrs, place)
    assert inside.read_text() == "real\n" and link.is_symlink()


# ---- Terraform -------------------------------------------------------------------------------
def tf_request(attributes: dict[str, Any], **extensions: Any) -> ResourceRequest:
    return ResourceRequest(
        id="builtin:terraform:terraform_data:x",
        type="Terraform",
        attributes=attributes,
        extensions={"provider": "terraform.io/builtin/terraform", **extensions},
    )


@pytest.mark.parametrize("kept", [False, True], ids=["alone", "batched"])
async def test_terraform_checks_before_anything_runs(
    tmp_path: Path, backend: StateBackend, kept: bool
) -> None:
    # Every call checks on its own (checks_every_call: callers skip theirs), alone or as a
    # batch member (with a state backend to keep each member's state)
    assert TerraformRuntime.checks_every_call
    rt = TerraformRuntime(
        root=tmp_path / "tf",
        binary=str(tmp_path / "no-tofu"),
        backend=backend if kept else None,
        policy=onprem_policy(tmp_path),
    )
    hostile = tf_request({"provisioner": [{"local-exec": {"command": "touch /tmp/x"}}]})
    for call in (rt.read, rt.preview, rt.apply, rt.delete, rt.wait_ready):
        with pytest.raises(PolicyViolation, match=r"attributes\.provisioner"):
            await call(hostile, OPTS)
    with pytest.raises(PolicyViolation, match=r"attributes\.provisioner"):
        await rt.observe(hostile, OPTS, with_preview=True)
    env = RuntimeOptions(project="p", workspace="w", context={"env": {"TF_CLI_ARGS": "-x"}})
    with pytest.raises(PolicyViolation, match=r"context\.env\.TF_CLI_ARGS"):
        await rt.apply(tf_request({"input": "x"}), env)
    assert not (tmp_path / "tf").exists()  # no working directory, so no tofu


def test_templates_in_keys_and_import_ids_are_escaped() -> None:
    r = tf_request(
        {"input": {'${file("/etc/passwd")}': "v", "%{ if true }x%{ endif }": "${x}"}},
        **{"kusionstack.io/import-id": '${file("/etc/passwd")}'},
    )
    doc = render_config(parse_resource(r), with_resource=True, import_existing=True)
    body = doc["resource"]["terraform_data"]["x"]["input"]
    assert body == {'$${file("/etc/passwd")}': "v", "%%{ if true }x%%{ endif }": "$${x}"}
    assert doc["import"] == [{"to": "terraform_data.x", "id": '$${file("/etc/passwd")}'}]


# ---- Kubernetes ------------------------------------------------------------------------------
def test_kubeconfig_plugins_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    config = tmp_path / "kube" / "config"
    config.parent.mkdir()
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "/bin/sh",
                                "args": ["-c", f"touch {marker}; echo '{{}}'"],
                            }
                        },
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    policy = onprem_policy(tmp_path, STACKFLOW_ALLOWED_KUBECONFIGS=str(config.parent))
    rt = KubernetesRuntime(policy)
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "d"}}
    r = ResourceRequest(
        id="v1:ConfigMap:d:x",
        type="Kubernetes",
        attributes=obj,
        extensions={"kubeConfig": str(config)},
    )
    with pytest.raises(PolicyViolation, match="exec credential plugin"):
        rt.client_for(r, OPTS)
    foreign = r.model_copy(update={"extensions": {"kubeConfig": "/etc/passwd"}})
    with pytest.raises(PolicyViolation, match=r"extensions\.kubeConfig: /etc/passwd"):
        rt.client_for(foreign, OPTS)
    by_context = r.model_copy(update={"extensions": {}})
    ctx = RuntimeOptions(project="p", workspace="w", context={"kubeConfig": "/etc/passwd"})
    with pytest.raises(PolicyViolation, match=r"context\.kubeConfig"):
        rt.client_for(by_context, ctx)
    assert not marker.exists()


async def test_every_kubernetes_call_checks_before_anything_runs(tmp_path: Path) -> None:
    """checks_every_call: callers skip their own check, so each call refuses on its own
    before a kubeconfig is loaded or a request sent."""
    assert KubernetesRuntime.checks_every_call
    rt = KubernetesRuntime(onprem_policy(tmp_path))
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "d"}}
    foreign = ResourceRequest(
        id="v1:ConfigMap:d:x",
        type="Kubernetes",
        attributes=obj,
        extensions={"kubeConfig": "/etc/passwd"},
    )
    for call in (rt.read, rt.preview, rt.apply, rt.delete, rt.wait_ready):
        with pytest.raises(PolicyViolation, match=r"extensions\.kubeConfig: /etc/passwd"):
            await call(foreign, OPTS)
    with pytest.raises(PolicyViolation, match=r"extensions\.kubeConfig: /etc/passwd"):
        await rt.observe(foreign, OPTS, with_preview=True)
    assert rt._clients == {}  # nothing connected
    await rt.close()


def test_a_kept_verdict_on_the_workers_kubeconfig_ends_when_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every resource is checked; the verdict on the worker's own kubeconfig is kept while
    the file is unchanged (no read), and a plugin written into it is refused at once."""
    from stackflow.runtimes.kubernetes import policy as kube_policy

    config = tmp_path / "kube" / "config"
    config.parent.mkdir()
    user: dict[str, Any] = {"name": "u", "user": {"token": "t"}}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [user],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    config.write_text(yaml.safe_dump(doc))
    policy = onprem_policy(tmp_path, KUBECONFIG=str(config))
    reads: list[str] = []
    real_read = kube_policy._kubeconfig_doc

    def counted(resource_id: str, field: str, path: str) -> dict[str, Any] | None:
        reads.append(path)
        return real_read(resource_id, field, path)

    monkeypatch.setattr(kube_policy, "_kubeconfig_doc", counted)

    def check() -> None:
        kube_policy.check_kubeconfig(
            policy, "v1:ConfigMap:d:x", None, None, config_field="f", context_field="c"
        )

    for _ in range(3):
        check()
    assert reads == [str(config)], "read once, then kept while the file is unchanged"
    user["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh"}}
    config.write_text(yaml.safe_dump(doc))
    with pytest.raises(PolicyViolation, match="exec credential plugin"):
        check()
    with pytest.raises(PolicyViolation, match="exec credential plugin"):
        check()  # a refusal is never kept as a pass


# ---- the activities: a whole spec before any runtime call ------------------------------------
class Gated(Runtime):
    """Refuses resources named bad*; counts every runtime call."""

    type_name = "OnPrem"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.checks = 0
        self.lock = threading.Lock()

    def check_policy(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        with self.lock:
            self.checks += 1
        if resource.id.startswith("bad") or resource.attributes.get("bad"):
            raise PolicyViolation(resource.id, "attributes.v", "refused")

    async def read(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes | None:
        self.calls.append(f"read {resource.id}")
        return None

    async def apply(self, resource: ResourceRequest, options: RuntimeOptions) -> Attributes:
        self.calls.append(f"apply {resource.id}")
        return dict(resource.attributes)

    async def delete(self, resource: ResourceRequest, options: RuntimeOptions) -> None:
        self.calls.append(f"delete {resource.id}")


def activities(backend: StateBackend) -> tuple[WorkerActivities, Gated]:
    runtime = Gated()
    registry = RuntimeRegistry()
    registry.register("OnPrem", lambda: runtime)
    return WorkerActivities.create(registry, backend, PriorStateCache(None, backend)), runtime


async def test_a_refusal_anywhere_stops_the_preview_before_any_runtime_call(
    backend: StateBackend,
) -> None:
    acts, runtime = activities(backend)
    spec = {
        "resources": [{"id": f"ok{i}", "type": "OnPrem", "attributes": {"v": i}} for i in range(5)]
        + [{"id": "bad", "type": "OnPrem", "attributes": {"v": 9}}]
    }
    request = OperationInput(project="p", workspace="w", spec=spec)
    plan = await acts.prepare.prepare_operation(
        PrepareInput(operation="preview", request=request, workflow_id="wf", run_id="r")
    )
    assert plan.plan_ref is not None
    batch = PreviewBatchInput(
        project="p",
        workspace="w",
        spec_ref=plan.spec_ref,
        revision=None,
        plan_ref=plan.plan_ref,
        start=0,
        end=2,  # a batch without the refused resource
    )
    with pytest.raises(ApplicationError) as err:
        await acts.preview.preview_batch(batch)
    assert err.value.type == "SpecError" and err.value.non_retryable
    assert err.value.message == "bad: attributes.v: refused"
    assert runtime.calls == []


async def test_a_spec_that_passed_is_checked_whole_once(backend: StateBackend) -> None:
    acts, runtime = activities(backend)
    tag = uuid.uuid4().hex  # a spec of its own: the memo is per process
    spec = {
        "resources": [
            {"id": f"ok{i}", "type": "OnPrem", "attributes": {"t": tag}} for i in range(6)
        ]
    }
    request = OperationInput(project="p2", workspace="w", spec=spec)
    plan = await acts.prepare.prepare_operation(
        PrepareInput(operation="preview", request=request, workflow_id="wf", run_id="r")
    )
    assert plan.plan_ref is not None
    for start in (0, 2, 4):
        await acts.preview.preview_batch(
            PreviewBatchInput(
                project="p2",
                workspace="w",
                spec_ref=plan.spec_ref,
                revision=None,
                plan_ref=plan.plan_ref,
                start=start,
                end=start + 2,
            )
        )
    assert runtime.checks == 6 + 3 * 2  # the whole spec once, then each batch its own
    assert len(runtime.calls) == 6


async def test_apply_checks_again_with_references_resolved(backend: StateBackend) -> None:
    acts, runtime = activities(backend)
    spec = {
        "resources": [
            {"id": "a", "type": "OnPrem", "attributes": {"bad": True}},
        ]
    }
    request = OperationInput(project="p3", workspace="w", spec=spec, auto_approve=True)
    plan = await acts.prepare.prepare_operation(
        PrepareInput(operation="apply", request=request, workflow_id="wf", run_id="r1")
    )
    node = NodeInput(
        project="p3",
        workspace="w",
        revision=1,
        spec_ref=plan.spec_ref,
        resource_id="a",
        action="Create",
        owner=RunRef(workflow_id="wf", run_id="r1"),
    )
    with pytest.raises(ApplicationError) as err:
        await acts.walk.apply_resource(node)
    assert err.value.type == "SpecError" and "a: attributes.v" in err.value.message
    assert runtime.calls == []
