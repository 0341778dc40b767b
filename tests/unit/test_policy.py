"""The worker policy (stackflow/runtimes/policy.py): settings from the environment and the policy
file,
and every rule, with real files (symlinks, sizes, kubeconfigs) in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from stackflow.runtimes.file_roots import onprem_target
from stackflow.runtimes.kubernetes.policy import check_kubeconfig
from stackflow.runtimes.onprem.policy import check_content
from stackflow.runtimes.policy import (
    PolicyConfigError,
    PolicyViolation,
    WorkerPolicy,
    load_policy,
    worker_policy,
)
from stackflow.runtimes.terraform.policy import (
    check_terraform,
    provider_allowed,
    refused_env_reason,
    terraform_env,
    tool_env,
)

RID = "r:1"


def policy(tmp_path: Path, **env: str) -> WorkerPolicy:
    """A policy from a clean environment: HOME and STACKFLOW_HOME in tmp_path."""
    base = {"HOME": str(tmp_path / "user"), "STACKFLOW_HOME": str(tmp_path / "sfhome")}
    return load_policy({**base, **env})


def refused(fn: Any, *args: Any, **kwargs: Any) -> PolicyViolation:
    with pytest.raises(PolicyViolation) as err:
        fn(*args, **kwargs)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{RID}: {err.value.field}: ")
    return err.value


# ---- settings --------------------------------------------------------------------------------
def test_defaults_refuse_what_is_not_configured(tmp_path: Path) -> None:
    p = policy(tmp_path)
    assert not p.terraform.allow_provisioners and p.terraform.allowed_env == ()
    assert p.terraform.allowed_providers == ("hashicorp/*",)
    assert p.kubernetes.allowed_kubeconfigs == () and p.kubernetes.allowed_contexts is None
    assert not p.kubernetes.allow_exec
    assert p.onprem.roots == () and int(p.onprem.max_bytes) == 1024 * 1024
    assert p.source == "defaults"
    err = refused(onprem_target, p, RID, str(tmp_path / "f"))
    assert err.field == "attributes.path" and "STACKFLOW_ONPREM_ROOTS" in str(err)


def test_environment_variables_are_parsed(tmp_path: Path) -> None:
    p = policy(
        tmp_path,
        STACKFLOW_ALLOW_PROVISIONERS="yes",
        STACKFLOW_ALLOWED_ENV=" AWS_* , ARM_CLIENT_ID,,",
        STACKFLOW_TF_PASS_ENV="GOOGLE_*",
        STACKFLOW_ALLOWED_TF_PROVIDERS="hashicorp/*,registry.example.com/acme/*",
        STACKFLOW_ALLOWED_KUBECONFIGS=f"{tmp_path}/a.yaml:~/b.yaml",
        STACKFLOW_ALLOWED_KUBE_CONTEXTS="dev-*,staging",
        STACKFLOW_ALLOW_KUBE_EXEC="true",
        STACKFLOW_ONPREM_ROOTS=f"{tmp_path}/r1:{tmp_path}/r2/../r3",
        STACKFLOW_ONPREM_MAX_BYTES="64KiB",
    )
    assert p.terraform.allow_provisioners and p.kubernetes.allow_exec
    assert p.terraform.allowed_env == ("AWS_*", "ARM_CLIENT_ID")
    assert p.terraform.pass_env == ("GOOGLE_*",)
    assert p.terraform.allowed_providers == ("hashicorp/*", "registry.example.com/acme/*")
    assert p.kubernetes.allowed_kubeconfigs == (
        f"{tmp_path}/a.yaml",
        os.path.expanduser("~/b.yaml"),
    )
    assert p.kubernetes.allowed_contexts == ("dev-*", "staging")
    assert p.onprem.roots == (f"{tmp_path}/r1", f"{tmp_path}/r3")
    assert int(p.onprem.max_bytes) == 65536
    assert p.source == "environment"
    assert "provisioners allowed" in p.summary()


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("STACKFLOW_ALLOW_PROVISIONERS", "maybe", "valid boolean"),
        ("STACKFLOW_ONPREM_MAX_BYTES", "lots", "byte"),
        ("STACKFLOW_ONPREM_ROOTS", "relative/dir", "not an absolute path"),
        ("STACKFLOW_ALLOWED_KUBECONFIGS", "kube.yaml", "not an absolute path"),
        ("STACKFLOW_ALLOWED_ENV", "A=B", "not a variable name or glob"),
        ("STACKFLOW_ALLOWED_TF_PROVIDERS", "random", "'<namespace>/<name>'"),
    ],
)
def test_bad_settings_name_the_variable(
    tmp_path: Path, var: str, value: str, fragment: str
) -> None:
    with pytest.raises(PolicyConfigError) as err:
        policy(tmp_path, **{var: value})
    assert str(err.value).startswith(f"worker policy: {var}: ") and fragment in str(err.value)
    assert err.value.exit_code == 1  # the worker's problem, not the spec's


def test_empty_variables_count_as_unset(tmp_path: Path) -> None:
    p = policy(tmp_path, STACKFLOW_ALLOW_PROVISIONERS="", STACKFLOW_ALLOWED_KUBE_CONTEXTS=" ")
    assert not p.terraform.allow_provisioners and p.kubernetes.allowed_contexts is None


def test_policy_file_and_environment_overrides(tmp_path: Path) -> None:
    file = tmp_path / "policy.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "terraform": {"allowed_env": ["AWS_*"], "allow_provisioners": True},
                "kubernetes": {"allowed_contexts": ["dev"]},
                "onprem": {"roots": [str(tmp_path / "srv")], "max_bytes": "2MiB"},
            }
        )
    )
    p = policy(tmp_path, STACKFLOW_POLICY_FILE=str(file), STACKFLOW_ALLOW_PROVISIONERS="0")
    assert p.terraform.allowed_env == ("AWS_*",) and not p.terraform.allow_provisioners
    assert p.kubernetes.allowed_contexts == ("dev",)
    assert int(p.onprem.max_bytes) == 2 * 1024 * 1024
    assert p.source == f"file {file} + environment"
    assert any(x.path == str(file) for x in p.protected)  # no spec rewrites the policy


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("terraform: {allow_provisoners: true}\n", "terraform.allow_provisoners"),
        ("onprem: {roots: [rel]}\n", "onprem.roots"),
        ("[1, 2]\n", "expected a mapping"),
        ("terraform: [\n", "expected"),
    ],
)
def test_bad_policy_files_name_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    file = tmp_path / "policy.yaml"
    file.write_text(text)
    with pytest.raises(PolicyConfigError) as err:
        policy(tmp_path, STACKFLOW_POLICY_FILE=str(file))
    message = str(err.value)
    assert str(file) in message and "\n" not in message
    if "allow_provisoners" in text:
        assert "allow_provisoners" in message
    else:
        assert fragment in message or "onprem" in message


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyConfigError, match="No such file"):
        policy(tmp_path, STACKFLOW_POLICY_FILE=str(tmp_path / "none.yaml"))


def test_worker_policy_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKFLOW_ONPREM_ROOTS", str(tmp_path / "one"))
    first = worker_policy()
    assert worker_policy() is first  # cached
    monkeypatch.setenv("STACKFLOW_ONPREM_ROOTS", str(tmp_path / "two"))
    assert worker_policy().onprem.roots == (str(tmp_path / "two"),)


def test_stackflow_paths_are_protected(tmp_path: Path) -> None:
    p = policy(
        tmp_path,
        STACKFLOW_STATE_URL=f"sqlite:///{tmp_path}/db/state.db",
        STACKFLOW_ENCRYPTION_KEY_FILE=str(tmp_path / "keys" / "k"),
        TF_CLI_CONFIG_FILE=str(tmp_path / "tf" / "tofurc"),
        STACKFLOW_TF_BIN=str(tmp_path / "bin" / "tofu"),
        KUBECONFIG=f"{tmp_path}/kube/a:{tmp_path}/kube/b",
    )
    protected = {x.path for x in p.protected}
    for path in ("sfhome", "db", "keys", "tf", "bin", "kube/a", "kube/b", "user/.cache/stackflow"):
        assert str(tmp_path / path) in protected, path
    assert {"/proc", "/sys", "/dev"} <= protected
    assert str(Path(__file__).resolve().parents[2] / "stackflow") in protected
    assert p.worker_kubeconfigs == (f"{tmp_path}/kube/a", f"{tmp_path}/kube/b")


# ---- Terraform -------------------------------------------------------------------------------
def tf_check(p: WorkerPolicy, **overrides: Any) -> None:
    args: dict[str, Any] = {
        "provider_source": "registry.terraform.io/hashicorp/null",
        "provider_name": "null",
        "resource_type": "null_resource",
        "arguments": {},
        "provider_meta": {},
    }
    args.update(overrides)
    check_terraform(p, RID, **args)


@pytest.mark.parametrize("block", ["provisioner", "connection"])
def test_code_running_blocks_need_provisioners(tmp_path: Path, block: str) -> None:
    arguments = {block: [{"local-exec": {"command": "touch /tmp/x"}}]}
    err = refused(tf_check, policy(tmp_path), arguments=arguments)
    assert err.field == f"attributes.{block}" and "STACKFLOW_ALLOW_PROVISIONERS" in str(err)
    tf_check(policy(tmp_path, STACKFLOW_ALLOW_PROVISIONERS="1"), arguments=arguments)
    tf_check(policy(tmp_path), arguments={"triggers": {"provisioner": "x"}})  # a map key only


@pytest.mark.parametrize(
    "source", ["registry.terraform.io/hashicorp/external", "hashicorp/external", "x/shell"]
)
def test_code_running_providers_need_provisioners(tmp_path: Path, source: str) -> None:
    name = source.rsplit("/", 1)[-1]
    p = policy(tmp_path, STACKFLOW_ALLOWED_TF_PROVIDERS="*")
    err = refused(tf_check, p, provider_source=source, provider_name=name)
    assert err.field == "extensions.provider" and "runs programs" in str(err)
    trusted = policy(tmp_path, STACKFLOW_ALLOWED_TF_PROVIDERS="*", STACKFLOW_ALLOW_PROVISIONERS="1")
    tf_check(trusted, provider_source=source, provider_name=name)


@pytest.mark.parametrize(
    ("patterns", "source", "allowed"),
    [
        ("hashicorp/*", "registry.terraform.io/hashicorp/random", True),
        ("hashicorp/*", "registry.opentofu.org/hashicorp/random", True),
        ("hashicorp/*", "hashicorp/random", True),
        ("hashicorp/*", "Registry.Terraform.io/HashiCorp/Random", True),
        ("hashicorp/*", "evil.example.com/hashicorp/random", False),
        ("hashicorp/*", "registry.terraform.io/evil/random", False),
        ("hashicorp/random", "registry.terraform.io/hashicorp/null", False),
        ("mirror.corp/*/*", "mirror.corp/acme/thing", True),
        ("mirror.corp/*/*", "registry.terraform.io/acme/thing", False),
        ("*", "anything.example/a/b", True),
    ],
)
def test_provider_allowlist(tmp_path: Path, patterns: str, source: str, allowed: bool) -> None:
    p = policy(tmp_path, STACKFLOW_ALLOWED_TF_PROVIDERS=patterns)
    assert provider_allowed(p, source) is allowed
    if not allowed:
        err = refused(tf_check, p, provider_source=source, provider_name="random")
        assert err.field == "extensions.provider" and "STACKFLOW_ALLOWED_TF_PROVIDERS" in str(err)


def test_providers_implied_by_the_resource_type_are_checked(tmp_path: Path) -> None:
    p = policy(tmp_path, STACKFLOW_ALLOWED_TF_PROVIDERS="hashicorp/random")
    random = {"provider_source": "hashicorp/random", "provider_name": "random"}
    tf_check(p, resource_type="random_password", **random)
    builtin = {"provider_source": "terraform.io/builtin/terraform", "provider_name": "terraform"}
    tf_check(p, resource_type="terraform_data", **builtin)
    err = refused(tf_check, p, resource_type="null_resource", **builtin)
    assert err.field == "extensions.resourceType" and "hashicorp/null" in str(err)
    err = refused(tf_check, policy(tmp_path), resource_type="external", **random)
    assert err.field == "extensions.resourceType" and "runs programs" in str(err)
    err = refused(
        tf_check,
        policy(tmp_path),
        resource_type="random_id",
        arguments={"provider": "external.x"},
        **random,
    )
    assert err.field == "extensions.resourceType" and "hashicorp/external" in str(err)


def test_the_builtin_provider_is_always_allowed(tmp_path: Path) -> None:
    p = policy(tmp_path, STACKFLOW_ALLOWED_TF_PROVIDERS="mirror.corp/acme/x")
    tf_check(
        p,
        provider_source="terraform.io/builtin/terraform",
        provider_name="terraform",
        resource_type="terraform_data",
    )


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ({"exec": {"command": "sh"}}, "extensions.providerMeta.exec"),
        ({"config_path": "~/.kube/config"}, "extensions.providerMeta.config_path"),
        ({"shared_config_files": ["/x"]}, "extensions.providerMeta.shared_config_files"),
        (
            {"assume_role": [{"web_identity_token_file": "/t"}]},
            "extensions.providerMeta.assume_role[0].web_identity_token_file",
        ),
        ({"kubernetes": {"exec": {"command": "x"}}}, "extensions.providerMeta.kubernetes.exec"),
    ],
)
def test_provider_settings_that_run_programs_or_name_files(
    tmp_path: Path, meta: dict[str, Any], field: str
) -> None:
    err = refused(tf_check, policy(tmp_path), provider_meta=meta)
    assert err.field == field
    tf_check(policy(tmp_path, STACKFLOW_ALLOW_PROVISIONERS="1"), provider_meta=meta)
    tf_check(policy(tmp_path), provider_meta={"region": "eu", "s3_use_path_style": True})


def test_helm_postrender(tmp_path: Path) -> None:
    err = refused(
        tf_check,
        policy(tmp_path),
        resource_type="helm_release",
        arguments={"postrender": {"binary_path": "/bin/sh"}},
    )
    assert err.field == "attributes.postrender"


def test_files_named_by_resources_are_confined_like_onprem(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    p = policy(tmp_path, STACKFLOW_ONPREM_ROOTS=str(root))
    local = {"resource_type": "local_file", "provider_name": "local"}
    tf_check(p, arguments={"filename": str(root / "a.txt")}, **local)
    tf_check(p, arguments={"filename": "$kusion_path.x:y:z:w.path"}, **local)  # known at apply
    err = refused(tf_check, p, arguments={"filename": "/etc/cron.d/x"}, **local)
    assert err.field == "attributes.filename" and "outside" in str(err)
    err = refused(tf_check, p, arguments={"filename": "relative.txt"}, **local)
    assert "absolute path" in str(err)
    err = refused(
        tf_check,
        p,
        resource_type="archive_file",
        provider_name="archive",
        arguments={"source_dir": "/etc", "output_path": str(root / "x.zip")},
    )
    assert err.field == "attributes.source_dir"


# ---- context.env -----------------------------------------------------------------------------
def test_env_names_must_be_allowed(tmp_path: Path) -> None:
    p = policy(tmp_path, STACKFLOW_ALLOWED_ENV="AWS_*,ARM_CLIENT_ID")
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_REGION": "eu", "ARM_CLIENT_ID": 42}
    assert terraform_env(p, RID, env) == {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_REGION": "eu",
        "ARM_CLIENT_ID": "42",
    }
    assert terraform_env(p, RID, None) == {}
    err = refused(terraform_env, p, RID, {"GITHUB_TOKEN": "x"})
    assert err.field == "context.env.GITHUB_TOKEN" and "AWS_*, ARM_CLIENT_ID" in str(err)
    err = refused(terraform_env, policy(tmp_path), RID, {"AWS_REGION": "x"})
    assert "STACKFLOW_ALLOWED_ENV: none" in str(err)
    err = refused(terraform_env, p, RID, ["AWS_REGION"])
    assert err.field == "context.env"
    for bad in ({"A=B": "x"}, {"1X": "x"}, {"AWS_X": {"a": 1}}, {"AWS_X": None}, {"AWS_X": "a\0"}):
        refused(terraform_env, p, RID, bad)


@pytest.mark.parametrize(
    "name",
    [
        "TF_CLI_CONFIG_FILE",
        "TF_CLI_ARGS",
        "TF_CLI_ARGS_apply",
        "TF_PLUGIN_CACHE_DIR",
        "TF_DATA_DIR",
        "TF_LOG",
        "TF_LOG_PATH",
        "TF_REATTACH_PROVIDERS",
        "TF_IN_AUTOMATION",
        "TOFU_X",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "ld_preload",
        "DYLD_INSERT_LIBRARIES",
        "PATH",
        "Path",
        "HOME",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "BASH_ENV",
        "STACKFLOW_STATE_URL",
        "STACKFLOW_ENCRYPTION_KEY",
        "TEMPORAL_ADDRESS",
        "REDIS_URL",
        "HTTPS_PROXY",
        "https_proxy",
        "SSL_CERT_FILE",
        "KUBECONFIG",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "GODEBUG",
        "GIT_SSH_COMMAND",
        "XDG_CONFIG_HOME",
    ],
)
def test_tool_control_variables_are_always_refused(tmp_path: Path, name: str) -> None:
    assert refused_env_reason(name) is not None
    p = policy(tmp_path, STACKFLOW_ALLOWED_ENV="*")  # even when every name is allowed
    err = refused(terraform_env, p, RID, {name: "x"})
    assert err.field == f"context.env.{name}" and "never taken from a spec" in str(err)


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "GOOGLE_CREDENTIALS", "ARM_TENANT_ID"])
def test_credential_names_are_not_tool_controls(name: str) -> None:
    assert refused_env_reason(name) is None


def test_tool_env_keeps_the_worker_secrets_out(tmp_path: Path) -> None:
    worker = {
        "PATH": "/usr/bin",
        "HOME": "/home/w",
        "LC_ALL": "C.UTF-8",
        "HTTPS_PROXY": "http://proxy:3128",
        "TF_PLUGIN_CACHE_DIR": "/cache",
        "TF_CLI_CONFIG_FILE": "/etc/tofurc",
        "STACKFLOW_STATE_URL": "postgresql://u:pw@db/x",
        "STACKFLOW_ENCRYPTION_KEY": "k1:xxx",
        "TEMPORAL_ADDRESS": "t:7233",
        "REDIS_URL": "redis://r",
        "DATABASE_PASSWORD": "pw",
        "AWS_PROFILE": "worker",
        "LD_PRELOAD": "/x.so",
    }
    env = tool_env(policy(tmp_path), worker)
    assert env == {
        k: worker[k]
        for k in (
            "PATH",
            "HOME",
            "LC_ALL",
            "HTTPS_PROXY",
            "TF_PLUGIN_CACHE_DIR",
            "TF_CLI_CONFIG_FILE",
        )
    }
    passing = tool_env(policy(tmp_path, STACKFLOW_TF_PASS_ENV="AWS_*,*"), worker)
    assert passing["AWS_PROFILE"] == "worker" and passing["DATABASE_PASSWORD"] == "pw"
    assert not any(k.startswith(("STACKFLOW_", "TEMPORAL_", "REDIS_")) for k in passing)


# ---- Kubernetes ------------------------------------------------------------------------------
def kubeconfig(
    path: Path, users: dict[str, dict[str, Any]], contexts: dict[str, str], current: str
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": n, "user": u} for n, u in users.items()],
                "contexts": [
                    {"name": n, "context": {"cluster": "c", "user": u}} for n, u in contexts.items()
                ],
                "current-context": current,
            }
        )
    )
    return path


EXEC = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh"}}


def kube_check(p: WorkerPolicy, path: str | None, context: str | None = None) -> None:
    check_kubeconfig(
        p,
        RID,
        path,
        context,
        config_field="extensions.kubeConfig",
        context_field="extensions.kubeContext",
    )


def test_kubeconfig_paths_come_from_the_allowlist(tmp_path: Path) -> None:
    own = kubeconfig(tmp_path / "own", {"u": {"token": "t"}}, {"c": "u"}, "c")
    listed = kubeconfig(tmp_path / "ok" / "a.yaml", {"u": {"token": "t"}}, {"c": "u"}, "c")
    stray = kubeconfig(tmp_path / "stray.yaml", {"u": {"token": "t"}}, {"c": "u"}, "c")
    p = policy(tmp_path, KUBECONFIG=str(own), STACKFLOW_ALLOWED_KUBECONFIGS=str(tmp_path / "ok"))
    kube_check(p, None)  # the worker's own
    kube_check(p, str(own))
    kube_check(p, str(listed))
    kube_check(p, str(tmp_path / "ok" / "missing.yaml"))  # the client says it does not exist
    for path in (str(stray), "/etc/passwd", f"{listed}:{stray}"):
        err = refused(kube_check, p, path)
        assert err.field == "extensions.kubeConfig" and "STACKFLOW_ALLOWED_KUBECONFIGS" in str(err)
    link = tmp_path / "ok" / "link.yaml"
    link.symlink_to(stray)  # inside the allowed directory, but really elsewhere
    refused(kube_check, p, str(link))
    alias = tmp_path / "alias.yaml"
    alias.symlink_to(listed)  # elsewhere, but really an allowed file
    kube_check(p, str(alias))


def test_kubeconfig_plugins_need_allow_exec(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "k" / "config",
        {"plug": EXEC, "gcp": {"auth-provider": {"name": "gcp"}}, "tok": {"token": "t"}},
        {"exec-ctx": "plug", "gcp-ctx": "gcp", "tok-ctx": "tok"},
        "exec-ctx",
    )
    p = policy(tmp_path, STACKFLOW_ALLOWED_KUBECONFIGS=str(path))
    err = refused(kube_check, p, str(path))  # the current context's user
    assert "exec credential plugin" in str(err) and "STACKFLOW_ALLOW_KUBE_EXEC" in str(err)
    err = refused(kube_check, p, str(path), "gcp-ctx")
    assert "gcp auth-provider plugin" in str(err)
    kube_check(p, str(path), "tok-ctx")  # the plugin users are not used
    allowed = policy(
        tmp_path, STACKFLOW_ALLOWED_KUBECONFIGS=str(path), STACKFLOW_ALLOW_KUBE_EXEC="1"
    )
    kube_check(allowed, str(path))
    # the worker's own kubeconfig too
    own = policy(tmp_path, KUBECONFIG=str(path))
    err = refused(kube_check, own, None)
    assert err.field == "the worker's KUBECONFIG"


def test_contexts_from_the_allowlist(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config", {"u": {"token": "t"}}, {"dev-1": "u", "prod": "u"}, "prod"
    )
    p = policy(
        tmp_path, STACKFLOW_ALLOWED_KUBECONFIGS=str(path), STACKFLOW_ALLOWED_KUBE_CONTEXTS="dev-*"
    )
    kube_check(p, str(path), "dev-1")
    err = refused(kube_check, p, str(path), "prod")
    assert err.field == "extensions.kubeContext" and "'prod'" in str(err)
    err = refused(kube_check, p, str(path))  # the current-context is the one used
    assert err.field == "extensions.kubeConfig" and "'prod'" in str(err)


def test_unreadable_kubeconfigs_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("users: [\n")
    p = policy(tmp_path, STACKFLOW_ALLOWED_KUBECONFIGS=str(tmp_path))
    assert "cannot be read as a kubeconfig" in str(refused(kube_check, p, str(bad)))
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (5 * 1024 * 1024))
    assert "more than a kubeconfig needs" in str(refused(kube_check, p, str(big)))


# ---- OnPrem ----------------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ (an OnPrem root holding the stackflow home), outside/, and symlinks."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sfhome").mkdir()
    (tmp_path / "outside").mkdir()
    (root / "out-link").symlink_to(tmp_path / "outside")
    (root / "in-link").symlink_to(root / "sub")
    (root / "file-link").symlink_to("/etc/passwd")
    return tmp_path


def onprem_policy(tree: Path, **env: str) -> WorkerPolicy:
    return policy(
        tree,
        STACKFLOW_ONPREM_ROOTS=str(tree / "root"),
        STACKFLOW_HOME=str(tree / "root" / "sfhome"),
        **env,
    )


def test_paths_inside_the_roots(tree: Path) -> None:
    p = onprem_policy(tree)
    target = onprem_target(p, RID, str(tree / "root" / "sub" / "a" / "b.txt"))
    assert target.anchor == str(tree / "root")
    assert target.parent == str(tree / "root" / "sub" / "a") and target.name == "b.txt"
    via = onprem_target(p, RID, str(tree / "root" / "in-link" / "c.txt"))  # stays inside
    assert via.real == str(tree / "root" / "sub" / "c.txt")
    whole = onprem_target(p, RID, str(tree / "root" / "sub"), directory=True)
    assert whole.anchor == str(tree / "root")


@pytest.mark.parametrize(
    ("relative", "fragment"),
    [
        ("outside/x", "outside this worker's OnPrem roots"),
        ("root/../outside/x", "outside this worker's OnPrem roots"),
        ("root/out-link/x", "resolves to"),
        ("root/out-link", "resolves to"),
        ("root/file-link", "resolves to /etc/passwd"),
        ("root/sfhome/state.db", "stackflow's home"),
        ("root/sfhome/terraform/p/w/main.tf.json", "stackflow's home"),
    ],
)
def test_paths_out_of_the_roots_or_into_stackflow(tree: Path, relative: str, fragment: str) -> None:
    err = refused(onprem_target, onprem_policy(tree), RID, f"{tree}/{relative}")
    assert err.field == "attributes.path" and fragment in str(err)


def test_directories_holding_stackflow_paths(tree: Path) -> None:
    p = onprem_policy(tree)
    err = refused(onprem_target, p, RID, str(tree / "root"), directory=True)
    assert "holds" in str(err) and "sfhome" in str(err)
    onprem_target(p, RID, str(tree / "root" / "sub"), directory=True)
    free = policy(tree, STACKFLOW_ONPREM_ROOTS=str(tree / "root" / "sub"))
    target = onprem_target(free, RID, str(tree / "root" / "sub"), directory=True)
    assert target.anchor == str(tree / "root") and target.name == "sub"  # the root itself


def test_sizes(tree: Path) -> None:
    p = onprem_policy(tree, STACKFLOW_ONPREM_MAX_BYTES="1KiB")
    check_content(p, RID, "é" * 512)  # 1024 bytes
    err = refused(check_content, p, RID, "é" * 513)
    assert err.field == "attributes.content" and "1026 bytes" in str(err)
    big = tree / "root" / "sub" / "big"
    big.write_bytes(b"x" * 1025)
    onprem_target(p, RID, str(big))  # writing over it is fine
    err = refused(onprem_target, p, RID, str(big), reading=True)
    assert err.field == "attributes.path" and "1025 bytes" in str(err)
    os.truncate(big, 1024)
    onprem_target(p, RID, str(big), reading=True)


def test_four_eyes_names_projects_by_glob(tmp_path: Path) -> None:
    assert not policy(tmp_path).approvals.four_eyes_for("prod")
    found = policy(tmp_path, STACKFLOW_FOUR_EYES="prod-*, payments").approvals
    assert found.four_eyes == ("prod-*", "payments")
    assert found.four_eyes_for("prod-eu") and found.four_eyes_for("payments")
    assert not found.four_eyes_for("payments-dev") and not found.four_eyes_for("staging")
    assert (
        "four-eyes prod-*,payments"
        in policy(tmp_path, STACKFLOW_FOUR_EYES="prod-*,payments").summary()
    )
