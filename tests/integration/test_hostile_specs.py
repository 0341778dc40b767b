"""The hostile-spec corpus, end to end through the real CLI and a real worker: specs that try
to make the worker run code or touch files outside what its policy allows (provisioners,
code-running providers, environment injection, foreign kubeconfigs and their plugins,
OnPrem paths into stackflow's own files, out of the roots, through symlinks, too large).

Each case exits 2 quickly with one `Error:` line naming the resource and the field, leaves
no stack locked, and nothing ran or was written: the marker files the payloads would create
never appear, the files they target are untouched, and no Terraform working directory (so
no `tofu init`) exists on the worker.

One worker serves the whole corpus (module scope), with this policy: OnPrem roots = the
corpus directory, which also holds the worker's STACKFLOW_HOME (so stackflow's own files are
inside a root); a 64 KiB size limit; kubeconfigs only from `<root>/kubeconfigs`; contexts
`allowed-*`; `context.env` names `AWS_*` and `ARM_CLIENT_ID`; no provisioners, no kubeconfig
plugins.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from stackflow.core.refs import StackRef
from stackflow.state.backend import open_backend
from tests.integration.conftest import REPO, WorkerProcess, run_cli
from tests.integration.opshelp import new_project

BUILTIN = "terraform.io/builtin/terraform"
LIMIT = 64 * 1024


@dataclass
class Corpus:
    root: Path
    """The worker's only OnPrem root; holds its home and the allowed kubeconfigs."""
    outside: Path
    """A directory outside the root (symlink and traversal targets)."""
    env: dict[str, str]
    worker: WorkerProcess

    @property
    def home(self) -> Path:
        return Path(self.env["STACKFLOW_HOME"])

    @property
    def kubeconfigs(self) -> Path:
        return self.root / "kubeconfigs"


@pytest.fixture(scope="module")
def corpus(
    tmp_path_factory: pytest.TempPathFactory,
    temporal_address: str,
    redis_url: str,
    integration_postgres_url: str,
) -> Iterator[Corpus]:
    root = tmp_path_factory.mktemp("hostile-root")
    outside = tmp_path_factory.mktemp("hostile-outside")
    (root / "kubeconfigs").mkdir()
    env = dict(os.environ)
    for name in ("STACKFLOW_POLICY_FILE", "STACKFLOW_ALLOW_PROVISIONERS", "STACKFLOW_TF_PASS_ENV"):
        env.pop(name, None)
    env.update(
        STACKFLOW_HOME=str(root / "home"),
        STACKFLOW_STATE_URL=integration_postgres_url,
        STACKFLOW_TASK_QUEUE=f"hostile-{uuid.uuid4().hex[:10]}",
        TEMPORAL_ADDRESS=temporal_address,
        REDIS_URL=redis_url,
        PYTHONPATH=str(REPO),
        STACKFLOW_ONPREM_ROOTS=str(root),
        STACKFLOW_ONPREM_MAX_BYTES="64KiB",
        STACKFLOW_ALLOWED_KUBECONFIGS=str(root / "kubeconfigs"),
        STACKFLOW_ALLOWED_KUBE_CONTEXTS="allowed-*",
        STACKFLOW_ALLOW_KUBE_EXEC="0",
        STACKFLOW_ALLOWED_ENV="AWS_*,ARM_CLIENT_ID",
    )
    (root / "home").mkdir()
    worker = WorkerProcess(root, env["STACKFLOW_TASK_QUEUE"], env)
    worker.start()
    try:
        yield Corpus(root=root, outside=outside, env=env, worker=worker)
    finally:
        worker.stop()
        shutil.rmtree(outside, ignore_errors=True)


# ---- spec pieces ----------------------------------------------------------------------------
def terraform_data(name: str, **attributes: Any) -> dict[str, Any]:
    return {
        "id": f"builtin:terraform:terraform_data:{name}",
        "type": "Terraform",
        "attributes": {"input": "x", **attributes},
        "extensions": {"provider": BUILTIN},
    }


def tf(
    ns: str, provider: str, rtype: str, name: str, attributes: dict[str, Any], **ext: Any
) -> dict[str, Any]:
    return {
        "id": f"{ns}:{provider}:{rtype}:{name}",
        "type": "Terraform",
        "attributes": attributes,
        "extensions": {"provider": f"registry.terraform.io/{ns}/{provider}/2.0.0", **ext},
    }


def config_map(name: str, **extensions: Any) -> dict[str, Any]:
    return {
        "id": f"v1:ConfigMap:default:{name}",
        "type": "Kubernetes",
        "attributes": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
            "data": {"a": "b"},
        },
        "extensions": extensions,
    }


def onprem(path: Path | str, content: str = "pwned\n", kind: str = "File") -> dict[str, Any]:
    attributes: dict[str, Any] = {"kind": kind, "path": str(path)}
    if kind == "File":
        attributes["content"] = content
    return {"id": f"onprem:{kind}:{path}", "type": "OnPrem", "attributes": attributes}


def kubeconfig(user: dict[str, Any], contexts: tuple[str, ...] = ("allowed-a",)) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": n, "context": {"cluster": "c", "user": "u"}} for n in contexts],
            "current-context": contexts[0],
        }
    )


def plugin_user(marker: Path) -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "/bin/sh",
            "args": ["-c", f"touch {marker}; echo '{{}}'"],
        }
    }


# ---- the cases -------------------------------------------------------------------------------
@dataclass
class Case:
    build: Callable[[Corpus, Path], list[dict[str, Any]]]
    """(corpus, the case's own directory inside the root) -> resources."""
    fragments: tuple[str, ...]
    context: Callable[[Corpus, Path], dict[str, Any]] | None = None
    command: str = "apply"
    absent: Callable[[Corpus, Path], list[Path]] = lambda c, d: [d / "marker"]
    """Paths that must not exist afterwards (markers, targets)."""
    untouched: Callable[[Corpus, Path], list[Path]] = lambda c, d: []
    """Existing files whose bytes must not change."""
    setup: Callable[[Corpus, Path], None] | None = None
    hidden: tuple[str, ...] = field(default=())
    """Text that must not appear in the output (a file's content)."""


def marker(d: Path) -> str:
    return f"touch {d / 'marker'}"


def local_exec(c: Corpus, d: Path) -> list[dict[str, Any]]:
    return [terraform_data("lx", provisioner=[{"local-exec": {"command": marker(d)}}])]


def remote_exec(c: Corpus, d: Path) -> list[dict[str, Any]]:
    body = {"inline": [marker(d)], "connection": {"type": "ssh", "host": "127.0.0.1"}}
    return [terraform_data("rx", provisioner=[{"remote-exec": body}])]


def with_env(name: str, value: str) -> Case:
    return Case(
        build=lambda c, d: [terraform_data(f"env{abs(hash(name)) % 10000}")],
        context=lambda c, d: {"env": {name: value}},
        fragments=("builtin:terraform:terraform_data:env", f"context.env.{name}"),
    )


def kube_exec_setup(c: Corpus, d: Path) -> None:
    (c.kubeconfigs / f"{d.name}.yaml").write_text(
        kubeconfig(plugin_user(d / "marker"), ("allowed-exec",))
    )


def auth_provider_setup(c: Corpus, d: Path) -> None:
    gcp = {"name": "gcp", "config": {"cmd-path": "/bin/sh", "cmd-args": f"-c '{marker(d)}'"}}
    (c.kubeconfigs / f"{d.name}.yaml").write_text(kubeconfig({"auth-provider": gcp}))


def context_setup(c: Corpus, d: Path) -> None:
    (c.kubeconfigs / f"{d.name}.yaml").write_text(
        kubeconfig({"token": "x"}, ("allowed-a", "production"))
    )


def stray_kubeconfig(c: Corpus, d: Path) -> None:
    (d / "stray.kubeconfig").write_text(kubeconfig(plugin_user(d / "marker")))


def big_file(c: Corpus, d: Path) -> None:
    (d / "big.log").write_bytes(b"s3cr3t-" * (LIMIT // 7 + 100))


def symlink_out(c: Corpus, d: Path) -> None:
    (d / "link").symlink_to(c.outside)


CRON = Path("/etc/cron.d") / f"stackflow-hostile-{uuid.uuid4().hex[:8]}"

CASES: dict[str, Case] = {
    # ---- Terraform: code-running blocks and providers
    "tf-local-exec-provisioner": Case(
        build=local_exec,
        fragments=("builtin:terraform:terraform_data:lx", "attributes.provisioner"),
    ),
    "tf-remote-exec-provisioner": Case(
        build=remote_exec,
        fragments=("builtin:terraform:terraform_data:rx", "attributes.provisioner"),
    ),
    "tf-connection-block": Case(
        build=lambda c, d: [terraform_data("cx", connection={"type": "ssh", "host": "x"})],
        fragments=("builtin:terraform:terraform_data:cx", "attributes.connection"),
    ),
    "tf-external-data-source": Case(
        build=lambda c, d: [
            tf("hashicorp", "external", "external", "ext", {"program": ["sh", "-c", marker(d)]})
        ],
        fragments=("hashicorp:external:external:ext", "extensions.provider", "external"),
        command="preview",
    ),
    "tf-provider-exec-block": Case(
        build=lambda c, d: [
            tf(
                "hashicorp",
                "kubernetes",
                "kubernetes_namespace_v1",
                "ns",
                {"metadata": {"name": "x"}},
                providerMeta={
                    "exec": {"api_version": "v1", "command": "/bin/sh", "args": ["-c", marker(d)]}
                },
            )
        ],
        fragments=("hashicorp:kubernetes:kubernetes_namespace_v1:ns", "providerMeta.exec"),
    ),
    "tf-external-implied-by-resource-type": Case(
        build=lambda c, d: [
            {
                "id": "builtin:terraform:external:implied",
                "type": "Terraform",
                "attributes": {"program": ["sh", "-c", marker(d)]},
                "extensions": {"provider": BUILTIN, "resourceType": "external"},
            }
        ],
        fragments=("builtin:terraform:external:implied", "extensions.resourceType", "external"),
    ),
    "tf-provider-not-allowed": Case(
        build=lambda c, d: [tf("evil", "pwn", "pwn_thing", "p", {})],
        fragments=("evil:pwn:pwn_thing:p", "extensions.provider", "STACKFLOW_ALLOWED_TF_PROVIDERS"),
    ),
    "tf-local-file-outside-roots": Case(
        build=lambda c, d: [
            tf("hashicorp", "local", "local_file", "cron", {"filename": str(CRON), "content": "x"})
        ],
        fragments=("hashicorp:local:local_file:cron", "attributes.filename", "outside"),
        absent=lambda c, d: [CRON],
    ),
    "tf-any-argument-naming-proc": Case(
        build=lambda c, d: [terraform_data("environ", input="/proc/1/environ")],
        fragments=("builtin:terraform:terraform_data:environ", "attributes.input", "outside"),
    ),
    "tf-upload-source-of-the-workers-credentials": Case(
        build=lambda c, d: [
            tf(
                "hashicorp",
                "aws",
                "aws_s3_object",
                "keys",
                {"bucket": "b", "source": "~/.ssh/id_rsa"},
            )
        ],
        fragments=("hashicorp:aws:aws_s3_object:keys", "attributes.source", "home directory"),
        command="preview",
    ),
    # ---- Terraform: environment injection through context.env
    "env-tf-cli-config-file": with_env("TF_CLI_CONFIG_FILE", "/tmp/evil.tofurc"),
    "env-tf-cli-args-apply": with_env("TF_CLI_ARGS_apply", "-parallelism=1"),
    "env-ld-preload": with_env("LD_PRELOAD", "/tmp/evil.so"),
    "env-path": with_env("PATH", "/tmp/evil-bin"),
    "env-home": with_env("HOME", "/tmp/evil-home"),
    "env-stackflow-state-url": with_env("STACKFLOW_STATE_URL", "sqlite:////tmp/other.db"),
    "env-aws-config-file-despite-glob": with_env("AWS_CONFIG_FILE", "/tmp/evil-aws-config"),
    "env-name-not-allowed": with_env("GITHUB_TOKEN", "ghp_x"),
    # ---- Kubernetes: kubeconfigs and plugins
    "kube-etc-passwd": Case(
        build=lambda c, d: [config_map("pw", kubeConfig="/etc/passwd")],
        fragments=("v1:ConfigMap:default:pw", "extensions.kubeConfig", "/etc/passwd"),
        hidden=("root:x:0:0",),
    ),
    "kube-stray-file": Case(
        setup=stray_kubeconfig,
        build=lambda c, d: [config_map("stray", kubeConfig=str(d / "stray.kubeconfig"))],
        fragments=("v1:ConfigMap:default:stray", "extensions.kubeConfig", "STACKFLOW_ALLOWED_"),
    ),
    "kube-spec-context-kubeconfig": Case(
        setup=stray_kubeconfig,
        build=lambda c, d: [config_map("ctx")],
        context=lambda c, d: {"kubeConfig": str(d / "stray.kubeconfig")},
        fragments=("v1:ConfigMap:default:ctx", "context.kubeConfig"),
    ),
    "kube-exec-plugin": Case(
        setup=kube_exec_setup,
        build=lambda c, d: [config_map("plug", kubeConfig=str(c.kubeconfigs / f"{d.name}.yaml"))],
        fragments=("v1:ConfigMap:default:plug", "extensions.kubeConfig", "exec credential plugin"),
    ),
    "kube-auth-provider-plugin": Case(
        setup=auth_provider_setup,
        build=lambda c, d: [config_map("gcp", kubeConfig=str(c.kubeconfigs / f"{d.name}.yaml"))],
        fragments=("v1:ConfigMap:default:gcp", "extensions.kubeConfig", "auth-provider"),
        command="preview",
    ),
    "kube-context-not-allowed": Case(
        setup=context_setup,
        build=lambda c, d: [
            config_map(
                "prod",
                kubeConfig=str(c.kubeconfigs / f"{d.name}.yaml"),
                kubeContext="production",
            )
        ],
        fragments=("v1:ConfigMap:default:prod", "extensions.kubeContext", "production"),
    ),
    # ---- OnPrem: stackflow's own files, out of the roots, symlinks, sizes
    "onprem-state-db": Case(
        build=lambda c, d: [onprem(c.home / "state.db")],
        fragments=("state.db", "attributes.path", "stackflow's home"),
        absent=lambda c, d: [c.home / "state.db"],
    ),
    "onprem-terraform-workdir": Case(
        build=lambda c, d: [onprem(c.home / "terraform" / "p" / "w" / "main.tf.json")],
        fragments=("main.tf.json", "attributes.path", "stackflow's home"),
    ),
    "onprem-directory-holding-home": Case(
        build=lambda c, d: [onprem(c.root, kind="Directory")],
        fragments=(f"onprem:Directory:{'{root}'}", "attributes.path", "holds"),
    ),
    "onprem-allowed-kubeconfig": Case(
        setup=context_setup,
        build=lambda c, d: [onprem(c.kubeconfigs / f"{d.name}.yaml", content="users: []\n")],
        fragments=("kubeconfigs", "attributes.path", "an allowed kubeconfig"),
        untouched=lambda c, d: [c.kubeconfigs / f"{d.name}.yaml"],
    ),
    "onprem-read-etc-passwd-by-preview": Case(
        build=lambda c, d: [onprem("/etc/passwd")],
        fragments=("onprem:File:/etc/passwd", "attributes.path", "outside"),
        command="preview",
        untouched=lambda c, d: [Path("/etc/passwd")],
        hidden=("root:x:0:0",),
    ),
    "onprem-write-etc-cron-d": Case(
        build=lambda c, d: [onprem(CRON, content="* * * * * root " + marker(d) + "\n")],
        fragments=(f"onprem:File:{CRON}", "attributes.path", "outside"),
        absent=lambda c, d: [CRON, d / "marker"],
    ),
    "onprem-symlink-out-of-root": Case(
        setup=symlink_out,
        build=lambda c, d: [onprem(d / "link" / "planted")],
        fragments=("link/planted", "attributes.path", "resolves to"),
        absent=lambda c, d: [c.outside / "planted"],
    ),
    "onprem-dotdot-traversal": Case(
        build=lambda c, d: [onprem(f"{c.root}/../{c.outside.name}/escaped")],
        fragments=("/../", "attributes.path", "outside"),
        absent=lambda c, d: [c.outside / "escaped"],
    ),
    "onprem-content-over-limit": Case(
        build=lambda c, d: [onprem(d / "huge.txt", content="z" * (LIMIT + 1))],
        fragments=("huge.txt", "attributes.content", "STACKFLOW_ONPREM_MAX_BYTES"),
        absent=lambda c, d: [d / "huge.txt"],
    ),
    "onprem-read-huge-file-by-preview": Case(
        setup=big_file,
        build=lambda c, d: [onprem(d / "big.log", content="small\n")],
        fragments=("big.log", "attributes.path", "STACKFLOW_ONPREM_MAX_BYTES"),
        command="preview",
        untouched=lambda c, d: [d / "big.log"],
        hidden=("s3cr3t",),
    ),
}


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def assert_one_clean_line(proc: Any, fragments: tuple[str, ...]) -> str:
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{err}"
    assert "Traceback" not in err + proc.stdout
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, lines
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_spec_is_refused(name: str, corpus: Corpus) -> None:
    case = CASES[name]
    d = corpus.root / "cases" / name
    d.mkdir(parents=True)
    if case.setup is not None:
        case.setup(corpus, d)
    untouched = {p: _digest(p) for p in case.untouched(corpus, d)}
    absent = case.absent(corpus, d)
    for path in absent:
        assert not path.exists(), f"{path} exists before the case ran"
    spec: dict[str, Any] = {"resources": case.build(corpus, d)}
    if case.context is not None:
        spec["context"] = case.context(corpus, d)
    spec_file = corpus.root / "specs" / f"{name}.yaml"
    spec_file.parent.mkdir(exist_ok=True)
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    project = new_project()
    args = [case.command, "-f", str(spec_file), "--project", project]
    if case.command == "apply":
        args.append("--yes")
    started = time.monotonic()
    try:
        proc = run_cli(corpus.env, *args, timeout=120)
        took = time.monotonic() - started
        fragments = tuple(f.replace("{root}", str(corpus.root)) for f in case.fragments)
        line = assert_one_clean_line(proc, fragments)
        print(f"{name} ({took:.1f}s): {line}")
        assert took < 30, f"took {took:.0f}s"
        for text in case.hidden:
            assert text not in proc.stdout + proc.stderr
        # nothing ran, nothing was written
        for path in absent:
            assert not path.exists(), f"{path} was created"
        for path, digest in untouched.items():
            assert _digest(path) == digest, f"{path} changed"
        assert not (corpus.home / "terraform").exists(), "a Terraform working dir was made"
        backend = open_backend(corpus.env["STACKFLOW_STATE_URL"])
        try:
            assert backend.lock(StackRef(project, "default")) is None, "stack left locked"
            latest = backend.latest(StackRef(project, "default"), with_spec=False)
            assert latest is None or latest.phase == "failed"
            if latest is not None:
                assert latest.state.resources == []
        finally:
            backend.close()
    finally:
        if CRON.exists():  # only if the policy failed: never leave it behind
            CRON.unlink()


def test_templates_in_keys_stay_literal(
    tmp_path: Path, stack_env: dict[str, str], worker_process: WorkerProcess
) -> None:
    """A template in an object key would call file() on the worker (JSON syntax reads keys
    as templates): it is written escaped, so OpenTofu's plan keeps the key as literal text."""
    key, directive = '${file("/etc/hostname")}', "%{ if true }x%{ endif }"
    spec = {"resources": [terraform_data("keys", input={key: "v", directive: 1})]}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    proc = run_cli(
        stack_env, "preview", "-f", str(spec_file), "--project", new_project(), "--output", "json"
    )
    assert proc.returncode == 0, proc.stderr
    [change] = json.loads(proc.stdout)["changes"]
    paths = {entry["path"] for entry in change["diff"]}
    assert f"input[{json.dumps(key)}]" in paths, paths
    assert f"input.{directive}" in paths, paths
    hostname = Path("/etc/hostname").read_text()
    assert f"input[{json.dumps(hostname)}]" not in paths and "input.x" not in paths
