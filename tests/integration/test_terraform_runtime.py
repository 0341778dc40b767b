"""The Terraform runtime against the real OpenTofu binary and providers from the local mirror.

Providers are the ones ``scripts/setup.sh terraform-providers`` builds from Go modules:
hashicorp/random 3.6.0, hashicorp/null 2.1.2, hashicorp/local 1.4.0; ``terraform_data``
is built into tofu. Every step goes through the runtime the way the activities call it:
read + preview + the engine's three-way diff, apply, delete.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stackflow.core.refs import StackRef
from stackflow.engine.diff import Change, diff_resource
from stackflow.engine.masking import SENSITIVE_MARKER, sensitive_paths_for
from stackflow.runtimes.base import InvalidInput, ResourceRequest, RuntimeOptions
from stackflow.runtimes.policy import PolicyViolation, load_policy
from stackflow.runtimes.terraform import SENSITIVE_KEY, STATE_KEY, TerraformRuntime

BUILTIN = {"provider": "terraform.io/builtin/terraform"}
MIRROR = Path.home() / ".cache" / "stackflow" / "terraform" / "mirror"


def ext(provider: str, version: str, rtype: str, **more: Any) -> dict[str, Any]:
    return {
        "provider": f"registry.terraform.io/hashicorp/{provider}/{version}",
        "resourceType": rtype,
        **more,
    }


RANDOM = ext("random", "3.6.0", "random_password")
NULL = ext("null", "2.1.2", "null_resource")
LOCAL = ext("local", "1.4.0", "local_file")


@pytest.fixture(scope="module", autouse=True)
def providers_installed(tf_bin: str) -> None:
    for name, version in (("random", "3.6.0"), ("null", "2.1.2"), ("local", "1.4.0")):
        binary = (
            MIRROR / "registry.terraform.io" / "hashicorp" / name / version / "linux_amd64"
        ) / f"terraform-provider-{name}_v{version}"
        if not binary.exists():
            pytest.fail(
                f"{binary} is missing: run `scripts/setup.sh terraform-providers`", pytrace=False
            )


@pytest.fixture
def runtime(tmp_path: Path) -> TerraformRuntime:
    return TerraformRuntime(root=tmp_path / "tf")


@pytest.fixture
def options() -> RuntimeOptions:
    return RuntimeOptions(project="tfproj", workspace="dev", timeout_seconds=120)


def req(
    rid: str, attrs: dict[str, Any], extensions: dict[str, Any], prior: dict[str, Any] | None = None
) -> ResourceRequest:
    return ResourceRequest(
        id=rid, type="Terraform", attributes=attrs, extensions=extensions, prior_state=prior
    )


async def preview(
    rt: TerraformRuntime, r: ResourceRequest, options: RuntimeOptions
) -> tuple[Change, bool]:
    """What the preview activity does: read, preview, three-way diff against the record."""
    live = await rt.read(r, options)
    result = await rt.preview(r, options)
    sensitive = result.sensitive_paths + sensitive_paths_for("Terraform", r.attributes)
    change = diff_resource(
        r.id, "Terraform", result.would_be, live, r.prior_state, sensitive_paths=sensitive
    )
    return change, result.replace


def paths(change: Change) -> list[str]:
    return [f.path for f in change.diff]


async def test_terraform_data_create_update_replace_delete(
    runtime: TerraformRuntime, options: RuntimeOptions
) -> None:
    rid = "builtin:terraform:terraform_data:app"
    r = req(rid, {"input": {"name": "app", "replicas": 1}}, BUILTIN)
    assert await runtime.read(r, options) is None

    change, replace = await preview(runtime, r, options)
    assert change.action == "Create" and not replace
    by_path = {f.path: f.new for f in change.diff}
    assert by_path["input.name"] == "app" and by_path["id"] == "(known after apply)"

    live = await runtime.apply(r, options)
    first_id = live["id"]
    assert live["output"] == {"name": "app", "replicas": 1}
    assert json.loads(live[STATE_KEY])["resources"][0]["type"] == "terraform_data"

    # preview after apply: nothing to do, and the reserved keys never show
    r = req(rid, r.attributes, BUILTIN, live)
    change, replace = await preview(runtime, r, options)
    assert change.action == "UnChanged" and change.diff == [] and not replace
    read_back = await runtime.read(r, options)
    assert read_back is not None and STATE_KEY not in read_back

    # update in place
    r = req(rid, {"input": {"name": "app", "replicas": 3}}, BUILTIN, live)
    change, replace = await preview(runtime, r, options)
    assert change.action == "Update" and not replace and not change.drift
    assert "input.replicas" in paths(change) and "id" not in paths(change)
    live = await runtime.apply(r, options)
    assert live["id"] == first_id and live["output"]["replicas"] == 3

    # replacement
    r = req(rid, {**r.attributes, "triggers_replace": "v2"}, BUILTIN, live)
    change, replace = await preview(runtime, r, options)
    assert change.action == "Update" and replace
    assert "id" in paths(change) and "triggers_replace" in paths(change)
    live = await runtime.apply(r, options)
    assert live["id"] != first_id and live["triggers_replace"] == "v2"

    # delete, then delete again (missing is success), read says gone
    gone = req(rid, live, BUILTIN, live)
    await runtime.delete(gone, options)
    await runtime.delete(gone, options)
    assert await runtime.read(gone, options) is None


async def test_random_null_local_lifecycle_and_local_file_drift(
    runtime: TerraformRuntime, options: RuntimeOptions, tmp_path: Path
) -> None:
    # random_password: a generated secret, masked in previews, replaced when length changes
    pw = req("hashicorp:random:random_password:pw", {"length": 20, "special": False}, RANDOM)
    change, _ = await preview(runtime, pw, options)
    assert change.action == "Create"
    pw_live = await runtime.apply(pw, options)
    assert len(pw_live["result"]) == 20 and pw_live["result"].isalnum()
    assert "result" in pw_live[SENSITIVE_KEY]
    pw = req(pw.id, pw.attributes, RANDOM, pw_live)
    change, _ = await preview(runtime, pw, options)
    assert change.action == "UnChanged"
    longer = req(pw.id, {"length": 24, "special": False}, RANDOM, pw_live)
    change, replace = await preview(runtime, longer, options)
    assert change.action == "Update" and replace
    result_change = next(f for f in change.diff if f.path == "result")
    assert result_change.old == SENSITIVE_MARKER and result_change.new == SENSITIVE_MARKER
    assert pw_live["result"] not in json.dumps(change.model_dump())

    # null_resource: replaced when its triggers change
    nr = req("hashicorp:null:null_resource:hook", {"triggers": {"rev": "1"}}, NULL)
    nr_live = await runtime.apply(nr, options)
    nr2 = req(nr.id, {"triggers": {"rev": "2"}}, NULL, nr_live)
    change, replace = await preview(runtime, nr2, options)
    assert change.action == "Update" and replace
    nr2_live = await runtime.apply(nr2, options)
    # (null 2.1.2 seeds its id generator with the wall-clock second: ids may repeat)
    assert nr2_live["triggers"] == {"rev": "2"}
    assert json.loads(nr2_live[STATE_KEY])["serial"] > json.loads(nr_live[STATE_KEY])["serial"]

    # local_file: create, update (a replacement for this provider), drift, delete
    target = tmp_path / "out" / "motd.txt"
    lf = req("hashicorp:local:local_file:motd", {"content": "one", "filename": str(target)}, LOCAL)
    lf_live = await runtime.apply(lf, options)
    assert target.read_text() == "one"
    lf = req(lf.id, {"content": "two", "filename": str(target)}, LOCAL, lf_live)
    change, replace = await preview(runtime, lf, options)
    assert change.action == "Update" and replace and "content" in paths(change)
    assert target.read_text() == "one"  # preview never applies
    lf_live = await runtime.apply(lf, options)
    assert target.read_text() == "two"
    lf = req(lf.id, lf.attributes, LOCAL, lf_live)
    assert (await preview(runtime, lf, options))[0].action == "UnChanged"

    target.unlink()  # behind stackflow's back
    change, _ = await preview(runtime, lf, options)
    assert change.action == "Create" and change.drift
    lf_live = await runtime.apply(lf, options)
    assert target.read_text() == "two"

    for r, live in ((lf, lf_live), (nr2, nr2_live), (pw, pw_live)):
        await runtime.delete(req(r.id, live, r.extensions, live), options)
    assert not target.exists()


async def test_drift_from_a_separate_tofu_run_is_shown_and_repaired(
    runtime: TerraformRuntime, options: RuntimeOptions, tf_bin: str
) -> None:
    rid = "builtin:terraform:terraform_data:cfg"
    r = req(rid, {"input": {"level": "info"}}, BUILTIN)
    live = await runtime.apply(r, options)
    r = req(rid, r.attributes, BUILTIN, live)

    # someone runs tofu by hand against the same state (the resource's working directory)
    workdir = runtime.workdir_path(rid, options)
    config = json.loads((workdir / "main.tf.json").read_text())
    config["resource"]["terraform_data"]["cfg"]["input"] = {"level": "debug"}
    (workdir / "main.tf.json").write_text(json.dumps(config))
    subprocess.run(
        [tf_bin, "apply", "-auto-approve", "-input=false", "-no-color"],
        cwd=workdir,
        check=True,
        capture_output=True,
    )

    change, _ = await preview(runtime, r, options)
    assert change.action == "Update" and change.drift
    assert [(f.path, f.old, f.new) for f in change.diff if f.path == "input.level"] == [
        ("input.level", "debug", "info")
    ]
    repaired = await runtime.apply(r, options)
    assert repaired["input"] == {"level": "info"} and repaired["id"] == live["id"]
    assert json.loads(repaired[STATE_KEY])["serial"] > json.loads(live[STATE_KEY])["serial"]
    r = req(rid, r.attributes, BUILTIN, repaired)
    assert (await preview(runtime, r, options))[0].action == "UnChanged"


async def test_fresh_working_directory_works_from_the_recorded_state(
    tmp_path: Path, options: RuntimeOptions
) -> None:
    first = TerraformRuntime(root=tmp_path / "machine-a")
    td = req("builtin:terraform:terraform_data:x", {"input": "a"}, BUILTIN)
    pw = req("hashicorp:random:random_password:db", {"length": 12}, RANDOM)
    td_live = await first.apply(td, options)
    pw_live = await first.apply(pw, options)
    shutil.rmtree(tmp_path / "machine-a")

    # another worker, nothing cached: reads, previews and changes from the release's state
    second = TerraformRuntime(root=tmp_path / "machine-b")
    td = req(td.id, td.attributes, BUILTIN, td_live)
    pw = req(pw.id, pw.attributes, RANDOM, pw_live)
    read_td = await second.read(td, options)
    assert read_td is not None and read_td["id"] == td_live["id"]
    assert (await preview(second, td, options))[0].action == "UnChanged"
    assert (await preview(second, pw, options))[0].action == "UnChanged"
    td2 = req(td.id, {"input": "b"}, BUILTIN, td_live)
    td2_live = await second.apply(td2, options)
    assert td2_live["id"] == td_live["id"] and td2_live["output"] == "b"
    same_pw = await second.apply(pw, options)
    assert same_pw["result"] == pw_live["result"]  # not regenerated

    shutil.rmtree(tmp_path / "machine-b")
    third = TerraformRuntime(root=tmp_path / "machine-c")
    await third.delete(req(td.id, td2_live, BUILTIN, td2_live), options)
    await third.delete(req(pw.id, same_pw, RANDOM, same_pw), options)
    assert await third.read(req(td.id, td2_live, BUILTIN, td2_live), options) is None


async def test_import_by_id(runtime: TerraformRuntime, options: RuntimeOptions) -> None:
    importing = {**RANDOM, "kusionstack.io/import-id": "Imported-Secret-42"}
    pw = req("hashicorp:random:random_password:legacy", {"length": 18}, importing)
    existing = await runtime.read(pw, options)
    assert existing is not None and existing["result"] == "Imported-Secret-42"
    change, _ = await preview(runtime, pw, options)
    assert change.action == "UnChanged", change
    live = await runtime.apply(pw, options)
    assert live["result"] == "Imported-Secret-42"
    pw = req(pw.id, pw.attributes, importing, live)
    assert (await preview(runtime, pw, options))[0].action == "UnChanged"

    td_ext = {**BUILTIN, "kusionstack.io/import-id": "td-legacy-1"}
    td = req("builtin:terraform:terraform_data:legacy", {}, td_ext)
    td_live = await runtime.apply(td, options)
    assert td_live["id"] == "td-legacy-1"


async def test_invalid_arguments_fail_at_preview_with_the_cli_message(
    runtime: TerraformRuntime, options: RuntimeOptions
) -> None:
    bad = req("hashicorp:random:random_password:typo", {"lenght": 16}, RANDOM)
    with pytest.raises(InvalidInput) as caught:
        await runtime.preview(bad, options)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("hashicorp:random:random_password:typo: terraform plan failed:")
    assert 'No argument or block type is named "lenght"' in message
    assert "main.tf.json" not in message  # stackflow's generated file: its lines mean nothing
    with pytest.raises(InvalidInput, match=r'named "lenght"'):  # found at apply: not retried
        await runtime.apply(bad, options)

    wrong_type = req("hashicorp:random:random_password:t", {"length": "long"}, RANDOM)
    with pytest.raises(InvalidInput, match=r"number is required|Incorrect attribute value type"):
        await runtime.preview(wrong_type, options)

    missing = req("hashicorp:random:random_password:v", {"length": 8}, ext("random", "9.9.9", "x"))
    with pytest.raises(InvalidInput, match=r"terraform init failed: .*9\.9\.9"):
        await runtime.preview(missing, options)

    with pytest.raises(InvalidInput, match=r"extensions\.provider is required"):
        await runtime.preview(req("a:b:c:d", {}, {}), options)


async def test_context_env_reaches_the_cli_and_is_not_recorded(
    tmp_path: Path, tf_bin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # credentials travel like this, when the worker policy allows their names; a wrapper
    # around tofu records the environment the CLI (and so its providers) gets
    dump = tmp_path / "env.txt"
    wrapper = tmp_path / "tofu-wrapper"
    wrapper.write_text(f'#!/bin/sh\nenv >> "{dump}"\necho ---- >> "{dump}"\nexec "{tf_bin}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("STACKFLOW_STATE_URL", "postgresql://u:secret-password@db/x")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("STACKFLOW_ENCRYPTION_KEY", "dev1:c2VjcmV0")
    monkeypatch.setenv("SF_WORKER_ONLY", "worker-private")
    policy = load_policy({**os.environ, "STACKFLOW_ALLOWED_ENV": "SF_TEST_*"})
    runtime = TerraformRuntime(root=tmp_path / "tf", binary=str(wrapper), policy=policy)
    token = f"token-{os.urandom(4).hex()}"
    opts = RuntimeOptions(
        project="tfproj", workspace="env", context={"env": {"SF_TEST_TOKEN": token}}
    )
    r = req("builtin:terraform:terraform_data:envcheck", {"input": "x"}, BUILTIN)
    live = await runtime.apply(r, opts)
    seen = dump.read_text()
    assert f"SF_TEST_TOKEN={token}" in seen
    assert "TF_CLI_CONFIG_FILE=" in seen and "PATH=" in seen and "TF_IN_AUTOMATION=1" in seen
    for private in ("STACKFLOW_", "REDIS_URL", "TEMPORAL_", "secret-password", "worker-private"):
        assert private not in seen, private
    assert token not in json.dumps(live)
    assert token not in (runtime.workdir_path(r.id, opts) / "main.tf.json").read_text()

    # a name the policy refuses never reaches the CLI: nothing runs
    dump.unlink()
    for name in ("LD_PRELOAD", "TF_CLI_ARGS_apply", "SF_OTHER"):
        bad = RuntimeOptions(project="tfproj", workspace="env", context={"env": {name: "x"}})
        with pytest.raises(PolicyViolation, match=rf"context\.env\.{name}"):
            await runtime.apply(r, bad)
    assert not dump.exists()


def counting_commands(runtime: TerraformRuntime, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tofu commands the runtime runs from now on, in order (each still runs)."""
    commands: list[str] = []
    real_run = runtime.cli.run

    async def counted(workdir: Path, command: str, *args: str, **kw: Any) -> Any:
        commands.append(command)
        return await real_run(workdir, command, *args, **kw)

    monkeypatch.setattr(runtime.cli, "run", counted)
    return commands


async def test_concurrent_calls_share_one_tofu_command_and_fail_alone(
    tmp_path: Path, options: RuntimeOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a state backend (as on a worker), concurrent calls of one provider configuration
    run as one command each step; a bad member fails with its own message, the others apply."""
    from stackflow.state.backend import open_backend

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend)
    commands = counting_commands(runtime, monkeypatch)
    good = [
        req(f"hashicorp:random:random_password:p{i}", {"length": 8 + i}, RANDOM) for i in range(6)
    ]
    bad = req("hashicorp:random:random_password:typo", {"lenght": 16}, RANDOM)
    try:
        seen = await asyncio.gather(*(runtime.observe(r, options, with_preview=True) for r in good))
        assert all(live is None for live, _ in seen)
        assert [p.would_be["length"] for _, p in seen if p] == [8 + i for i in range(6)]
        assert commands.count("plan") == 1 and commands.count("show") == 1

        commands.clear()
        lives = await asyncio.gather(
            *(runtime.apply(r, options) for r in [*good, bad]), return_exceptions=True
        )
        assert isinstance(lives[-1], InvalidInput) and 'named "lenght"' in str(lives[-1])
        assert str(lives[-1]).startswith("hashicorp:random:random_password:typo:")
        applied = [live for live in lives[:-1] if isinstance(live, dict)]
        assert [len(live["result"]) for live in applied] == [8 + i for i in range(6)]
        # the batch failed on the bad member; each then ran alone
        assert commands.count("apply") == 1 + 7

        recorded = [
            req(r.id, r.attributes, RANDOM, live) for r, live in zip(good, applied, strict=True)
        ]
        commands.clear()
        again = await asyncio.gather(
            *(runtime.observe(r, options, with_preview=True) for r in recorded)
        )
        for (live, result), before in zip(again, applied, strict=True):
            assert live is not None and live["result"] == before["result"]
            assert result is not None and result.would_be["result"] == before["result"]
            assert "result" in result.sensitive_paths
        # the plan's refresh read every object; it changes nothing, so no show: each preview
        # is what the state holds, exactly what show would have said
        assert commands == ["plan"]
        from stackflow.runtimes.terraform import workdir

        with monkeypatch.context() as m:
            m.setattr(workdir, "changes_nothing", lambda messages: False)
            commands.clear()
            shown = await asyncio.gather(
                *(runtime.observe(r, options, with_preview=True) for r in recorded)
            )
            assert commands == ["plan", "show"] and shown == again
        changed = [req(recorded[0].id, {"length": 20}, RANDOM, applied[0]), *recorded[1:]]
        commands.clear()
        await asyncio.gather(*(runtime.observe(r, options, with_preview=True) for r in changed))
        assert commands == ["plan", "show"]  # a change: show says what it is

        commands.clear()
        await asyncio.gather(*(runtime.delete(r, options) for r in recorded))
        assert commands == ["destroy"]
        # a preview whose batch plan fails: each member alone, the bad one says why
        fresh = req("hashicorp:random:random_password:q", {"length": 9}, RANDOM)
        (live, result), refused = await asyncio.gather(
            runtime.observe(fresh, options, with_preview=True),
            runtime.observe(bad, options, with_preview=True),
            return_exceptions=True,
        )
        assert live is None and result is not None and result.would_be["length"] == 9
        assert isinstance(refused, InvalidInput) and 'named "lenght"' in str(refused)

        # nothing that holds values stays on disk between commands, batches included
        left = {p.name for p in (tmp_path / "tf").rglob("*") if p.is_file()}
        assert not left & {"terraform.tfstate", "stackflow.tfplan", "main.tf.json"}, left
    finally:
        backend.close()


async def test_a_batch_preview_that_finds_drift_asks_show_what_changed(
    tmp_path: Path, options: RuntimeOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unchanged batch previews from the state alone (no show); a file changed behind
    stackflow's back (the plan's refresh reports drift) is shown through show, as before."""
    from stackflow.state.backend import open_backend

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend)
    commands = counting_commands(runtime, monkeypatch)
    files = [tmp_path / "out" / f"f{i}.txt" for i in range(3)]
    made = [
        req(f"hashicorp:local:local_file:f{i}", {"content": f"v{i}", "filename": str(f)}, LOCAL)
        for i, f in enumerate(files)
    ]
    try:
        lives = await asyncio.gather(*(runtime.apply(r, options) for r in made))
        recorded = [
            req(r.id, r.attributes, LOCAL, live) for r, live in zip(made, lives, strict=True)
        ]
        commands.clear()
        seen = await asyncio.gather(
            *(runtime.observe(r, options, with_preview=True) for r in recorded)
        )
        assert commands == ["plan"] and all(live is not None for live, _ in seen)
        files[1].write_text("changed behind stackflow's back")
        commands.clear()
        seen = await asyncio.gather(
            *(runtime.observe(r, options, with_preview=True) for r in recorded)
        )
        assert commands == ["plan", "show"]
        change = diff_resource(
            recorded[1].id, "Terraform", seen[1][1].would_be, seen[1][0], recorded[1].prior_state
        )
        assert change.action != "UnChanged", change
    finally:
        backend.close()


async def test_a_single_unchanged_preview_needs_no_show(
    runtime: TerraformRuntime, options: RuntimeOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One resource alone (no batch): a plan that changes nothing previews from the state,
    equal to what show would have said (the generated secret masked alike)."""
    from stackflow.runtimes.terraform import workdir

    pw = req("hashicorp:random:random_password:solo", {"length": 12}, RANDOM)
    live = await runtime.apply(pw, options)
    recorded = req(pw.id, pw.attributes, RANDOM, live)
    commands = counting_commands(runtime, monkeypatch)
    quiet = await runtime.preview(recorded, options)
    assert commands == ["plan"] and "result" in quiet.sensitive_paths
    with monkeypatch.context() as m:
        m.setattr(workdir, "changes_nothing", lambda messages: False)
        commands.clear()
        assert await runtime.preview(recorded, options) == quiet
        assert commands == ["plan", "show"]
    commands.clear()
    longer = await runtime.preview(req(pw.id, {"length": 13}, RANDOM, live), options)
    assert commands == ["plan", "show"] and longer.replace
    await runtime.delete(recorded, options)


async def test_a_large_batch_with_a_bad_member_halves_instead_of_running_each_alone(
    tmp_path: Path, options: RuntimeOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """21 calls in one command, one of them bad: the command fails, its halves run as
    commands again (the good half applies), and only a small half runs each member alone,
    so the bad member still fails with its own message."""
    from stackflow.runtimes.terraform.batch import SPLIT_ABOVE
    from stackflow.state.backend import open_backend

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend)
    commands = counting_commands(runtime, monkeypatch)
    good = [
        req(f"hashicorp:random:random_password:h{i:02d}", {"length": 8 + i}, RANDOM)
        for i in range(20)
    ]
    bad = req("hashicorp:random:random_password:typo", {"lenght": 16}, RANDOM)
    try:
        lives = await asyncio.gather(
            *(runtime.apply(r, options) for r in [*good, bad]), return_exceptions=True
        )
    finally:
        backend.close()
    assert isinstance(lives[-1], InvalidInput) and 'named "lenght"' in str(lives[-1])
    assert str(lives[-1]).startswith("hashicorp:random:random_password:typo:")
    assert [len(live["result"]) for live in lives[:-1] if isinstance(live, dict)] == [
        8 + i for i in range(20)
    ]
    # one command of 21, then halves (10 and 11, then 5 and 6): at most 5 commands, and
    # each member alone only in the last half of at most SPLIT_ABOVE (22 applies before)
    assert 5 + 1 <= commands.count("apply") <= 5 + SPLIT_ABOVE, commands


async def test_a_batch_whose_state_cannot_be_kept_leaves_it_for_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tofu created two objects in one batch, then the backend failed to keep their state:
    the retry on this host finds each object's state and creates nothing a second time."""
    from stackflow.core.errors import BackendUnavailableError
    from stackflow.state.backend import open_backend

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend)
    options = RuntimeOptions(project="keep", workspace="dev", timeout_seconds=120, revision=1)
    ids = ext("random", "3.6.0", "random_id")
    tokens = [req(f"hashicorp:random:random_id:t{i}", {"byte_length": 8}, ids) for i in range(2)]
    kept: list[Any] = []

    def down(*args: Any, **kwargs: Any) -> None:
        raise BackendUnavailableError("state backend unavailable (test)")

    def keep(stack: StackRef, bodies: dict[str, str], **kwargs: Any) -> None:
        kept.append(bodies)  # (the stack lock that fences real writes is not held here)

    try:
        monkeypatch.setattr(backend, "put_terraform_states", down)
        failed = await asyncio.gather(
            *(runtime.apply(t, options) for t in tokens), return_exceptions=True
        )
        assert all(isinstance(f, BackendUnavailableError) for f in failed), failed
        left = [runtime.workdir_path(t.id, options) / "terraform.tfstate" for t in tokens]
        created = [json.loads(p.read_text())["resources"][0]["instances"][0] for p in left]

        monkeypatch.setattr(backend, "put_terraform_states", keep)
        lives = await asyncio.gather(*(runtime.apply(t, options) for t in tokens))
        assert [live["id"] for live in lives] == [c["attributes"]["id"] for c in created]
        assert [sorted(k) for k in kept] == [sorted(t.id for t in tokens)]  # one transaction
        assert not any(p.exists() for p in left)  # used, kept, and gone from disk
    finally:
        backend.close()


async def test_a_batch_whose_callers_are_all_cancelled_stops_its_command(tmp_path: Path) -> None:
    """A run cancelled during a batch apply: the shared tofu command is interrupted (then
    killed) as a single resource's is, instead of running on after every caller left."""
    from stackflow.state.backend import open_backend

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    policy = load_policy({**os.environ, "STACKFLOW_ALLOW_PROVISIONERS": "1"})
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend, policy=policy)
    options = RuntimeOptions(project="stop", workspace="dev", timeout_seconds=300)
    marker = f"sleep 47.{os.getpid()}"  # a command line no other process has
    slow = [
        req(
            f"builtin:terraform:terraform_data:s{i}",
            {"input": i, "provisioner": [{"local-exec": {"command": marker}}]},
            BUILTIN,
        )
        for i in range(2)
    ]

    def sleeping() -> bool:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False)
        return found.returncode == 0

    try:
        calls = [asyncio.ensure_future(runtime.apply(r, options)) for r in slow]
        for _ in range(300):
            if sleeping():
                break
            await asyncio.sleep(0.1)
        assert sleeping(), "the provisioner never started"
        started = asyncio.get_running_loop().time()
        for c in calls:
            c.cancel()
        ended = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(e, asyncio.CancelledError) for e in ended)
        for _ in range(200):  # tofu gets SIGINT, then SIGKILL after its grace period
            if not sleeping():
                break
            await asyncio.sleep(0.1)
        assert not sleeping(), "the batch's command ran on after every caller was cancelled"
        assert asyncio.get_running_loop().time() - started < 20
        # nothing is left holding the batch: the retry (here without the provisioner) applies
        quick = [req(r.id, {"input": i}, BUILTIN) for i, r in enumerate(slow)]
        lives = await asyncio.gather(*(runtime.apply(r, options) for r in quick))
        assert [live["input"] for live in lives] == [0, 1]
    finally:
        subprocess.run(["pkill", "-f", marker], check=False)
        backend.close()


def recording_argv(runtime: TerraformRuntime, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each tofu command the runtime runs from now on: its command and positional arguments."""
    seen: list[list[str]] = []
    real_run = runtime.cli.run

    async def recorded(workdir: Path, command: str, *args: str, **kw: Any) -> Any:
        seen.append([command, *args])
        return await real_run(workdir, command, *args, **kw)

    monkeypatch.setattr(runtime.cli, "run", recorded)
    return seen


async def test_an_apply_applies_the_plan_its_preview_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An apply's preview keeps its batch's plan for the release; the release's apply of the
    same batch applies that plan (no second plan) and takes it; a batch whose inputs changed
    since its preview plans again, and a preview that is not an apply's keeps nothing."""
    from stackflow.core.refs import RunRef
    from stackflow.state.backend import open_backend
    from stackflow.state.schema import terraform_plans
    from stackflow.temporal.operation import Operation

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend)
    argv = recording_argv(runtime, monkeypatch)
    stack, run = StackRef("saved", "dev"), RunRef("stackflow/saved/dev", "r1")
    base = RuntimeOptions(project="saved", workspace="dev", timeout_seconds=120)
    data = [req(f"builtin:terraform:terraform_data:d{i}", {"input": i}, BUILTIN) for i in range(5)]
    try:
        revision = backend.create(stack, Operation.apply, run=run).revision
        previewing = base.model_copy(update={"preview_of": revision})
        applying = base.model_copy(update={"revision": revision, "owner": run})
        seen = await asyncio.gather(
            *(runtime.observe(r, previewing, with_preview=True) for r in reversed(data))
        )
        assert all(live is None and p is not None for live, p in seen)
        argv.clear()
        lives = await asyncio.gather(*(runtime.apply(r, applying) for r in data))
        assert [live["output"] for live in lives] == list(range(5))
        assert argv == [["apply", "stackflow.tfplan"]], argv  # the preview's plan, applied
        assert not list((tmp_path / "tf").rglob("stackflow.tfplan"))

        # the plan was taken: applying again plans (a no-op on the state just kept)
        argv.clear()
        recorded = [
            req(r.id, r.attributes, BUILTIN, live) for r, live in zip(data, lives, strict=True)
        ]
        again = await asyncio.gather(*(runtime.apply(r, applying) for r in recorded))
        assert [live["id"] for live in again] == [live["id"] for live in lives]
        assert argv == [["apply"]], argv

        # a value that changed since the preview: the apply plans, with the new value
        backend.unlock(stack)  # (the release ends; the next run's)
        revision = backend.create(stack, Operation.apply, run=run).revision
        previewing = base.model_copy(update={"preview_of": revision})
        applying = base.model_copy(update={"revision": revision, "owner": run})
        await asyncio.gather(*(runtime.observe(r, previewing, with_preview=True) for r in recorded))
        changed = [recorded[0].model_copy(update={"attributes": {"input": 99}}), *recorded[1:]]
        argv.clear()
        lives = await asyncio.gather(*(runtime.apply(r, applying) for r in changed))
        assert [live["output"] for live in lives] == [99, 1, 2, 3, 4]
        assert argv == [["apply"]], argv

        # a plain preview (not an apply's) keeps no plan for anyone: what is kept is the
        # unused plan of the last apply's preview only (an older release's went with it)
        await asyncio.gather(*(runtime.observe(r, base, with_preview=True) for r in changed))
        with backend.engine.begin() as conn:
            kept = conn.execute(terraform_plans.select()).fetchall()
        assert [row.revision for row in kept] == [revision]
    finally:
        backend.close()


async def test_a_delete_destroys_from_the_state_its_preview_refreshed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destroy's preview reads each object with one refresh and keeps the state it wrote
    for the release; the release's delete of the same batch destroys from that state without
    refreshing again (``-refresh=false``). A file deleted behind stackflow's back is gone in
    the preview and in that state, so the delete leaves it be; a delete without such a
    preview refreshes first, as before."""
    from stackflow.core.refs import RunRef
    from stackflow.state.backend import open_backend
    from stackflow.temporal.operation import Operation

    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    runtime = TerraformRuntime(root=tmp_path / "tf", backend=backend)
    seen: list[tuple[str, Any, bool]] = []  # each command, its -refresh, whether refresh-only
    real_run = runtime.cli.run

    async def recorded(workdir: Path, command: str, *args: str, **kw: Any) -> Any:
        if command != "init":  # (a new batch directory's)
            seen.append((command, kw.get("refresh"), "refresh_only" in kw))
        return await real_run(workdir, command, *args, **kw)

    monkeypatch.setattr(runtime.cli, "run", recorded)
    stack, run = StackRef("gone", "dev"), RunRef("stackflow/gone/dev", "r1")
    base = RuntimeOptions(project="gone", workspace="dev", timeout_seconds=120)
    files = [tmp_path / "out" / f"f{i}.txt" for i in range(3)]
    made = [
        req(f"hashicorp:local:local_file:f{i}", {"content": f"v{i}", "filename": str(f)}, LOCAL)
        for i, f in enumerate(files)
    ]

    async def created() -> list[ResourceRequest]:
        revision = backend.create(stack, Operation.apply, run=run).revision
        applying = base.model_copy(update={"revision": revision, "owner": run})
        lives = await asyncio.gather(*(runtime.apply(r, applying) for r in made))
        backend.unlock(stack)  # (the release ends; the next run's)
        return [req(r.id, r.attributes, LOCAL, live) for r, live in zip(made, lives, strict=True)]

    def tracked() -> list[bool]:
        states = backend.get_terraform_states(stack, [r.id for r in made])
        return [bool(json.loads(states[r.id])["resources"]) for r in made]

    try:
        recorded_ = await created()
        files[1].unlink()  # behind stackflow's back
        revision = backend.create(stack, Operation.destroy, run=run).revision
        previewing = base.model_copy(update={"preview_of": revision})
        deleting = base.model_copy(update={"revision": revision, "owner": run})
        seen.clear()
        lives = await asyncio.gather(*(runtime.read(r, previewing) for r in recorded_))
        assert [live is None for live in lives] == [False, True, False]
        assert seen == [("apply", None, True)]  # one refresh for the batch
        seen.clear()
        await asyncio.gather(*(runtime.delete(r, deleting) for r in recorded_))
        assert seen == [("destroy", False, False)], seen  # from the refreshed state
        assert not any(f.exists() for f in files) and tracked() == [False, False, False]
        backend.unlock(stack)

        # a delete whose preview kept nothing (another release's, or none) refreshes
        recorded_ = await created()
        revision = backend.create(stack, Operation.destroy, run=run).revision
        deleting = base.model_copy(update={"revision": revision, "owner": run})
        seen.clear()
        await asyncio.gather(*(runtime.delete(r, deleting) for r in recorded_))
        assert seen == [("destroy", None, False)], seen
        assert not any(f.exists() for f in files) and tracked() == [False, False, False]
    finally:
        backend.close()
