"""The project's policies hold against what a run brings, on the real OPA binary.

A run's own bundle is evaluated apart from the project's (an OPA process each): a run module
naming the package a project policy is evaluated in (``stackflow_gate.p0``) is refused, a
run library that shares the project's library's name changes nothing of the project's, a
run policy adds denials but removes none. A ``package stackflow`` line written with CRLF or
indented is a policy that denies; a module no policy imports is an error. OPA cannot read a
worker file through a ``file://`` JSON schema (``json.match_schema``/``json.verify_schema``
are not in its capabilities), and a policy that takes more memory than
``STACKFLOW_POLICY_MEMORY_MB`` fails the gate with one line, at once, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from stackflow.core.errors import SpecError
from stackflow.model.policy import Outcome, PolicyDecision, PolicyMessage
from stackflow.policy_gate.bundle import PolicyBundle, load_bundle_dir, problem_of
from stackflow.policy_gate.engine import (
    MEMORY_VAR,
    Module,
    PolicyError,
    capabilities_file,
    evaluate,
    evaluate_apart,
)
from stackflow.policy_gate.rego import RegoLayoutError, head
from tests.integration.conftest import require_env

pytestmark = pytest.mark.integration

INPUT = json.dumps(
    {
        "stack": {"project": "shop", "workspace": "prod"},
        "operation": "apply",
        "requested_by": "mallory",
        "changes": [{"id": "onprem:File:/srv/a.conf", "action": "Create", "after": {}}],
    }
).encode()

# the project's: every change needs a reviewer, through a helper in the policy and one in
# the project's library (what a run would like to make true)
PROJECT_GATE = """package stackflow

import data.stackflow.lib

deny contains {"msg": sprintf("%s: not reviewed", [c.id]), "resource": c.id} if {
	some c in input.changes
	not _reviewed
	not lib.approved_change(c)
}

_reviewed if input.requested_by == "reviewer"
"""
PROJECT_LIB = """package stackflow.lib

approved_change(c) if c.after.reviewed_by == "reviewer"
"""
DENIAL = ("project/gate.rego", "onprem:File:/srv/a.conf", "onprem:File:/srv/a.conf: not reviewed")


@pytest.fixture(scope="module", autouse=True)
def opa() -> str:
    return require_env("STACKFLOW_OPA_BIN")


def modules(scope: str, bundle: dict[str, str]) -> list[Module]:
    checked = PolicyBundle(modules=bundle)  # as the API and the CLI take a bundle
    return [Module(policy=f"{scope}/{p}", source=s) for p, s in checked.modules.items()]


def project() -> list[Module]:
    return modules("project", {"gate.rego": PROJECT_GATE, "lib.rego": PROJECT_LIB})


def decide(*bundles: list[Module]) -> PolicyDecision:
    messages, policies = evaluate_apart(bundles, INPUT)
    return PolicyDecision.of(
        messages,
        bundles=[],
        input_digest="sha256:" + "0" * 64,
        policies=policies,
        evaluated_at=None,
        duration_ms=0,
    )


def triples(messages: list[PolicyMessage]) -> set[tuple[str, str | None, str]]:
    return {(m.policy, m.resource, m.msg) for m in messages if m.rule == "deny"}


def test_the_project_alone_denies() -> None:
    decision = decide(project())
    assert decision.outcome == Outcome.denied
    assert triples(decision.messages) == {DENIAL}
    assert decision.policies == ["project/gate.rego"]


@pytest.mark.parametrize(
    "package",
    [
        "stackflow_gate.p0",  # the package the project's first policy is evaluated in
        'stackflow_gate["p0"]',
        "  stackflow_gate . p0",
        "stackflow_gate",
    ],
)
def test_a_run_module_in_the_gates_namespace_is_refused(tmp_path: Path, package: str) -> None:
    """On the old engine the run's ``_reviewed := true`` merged into the project's policy
    (one OPA evaluation, Rego merging rules across modules of a package): a pass."""
    evil = f"package {package}\n\n_reviewed := true\n"
    run = {"mine.rego": "package stackflow\n", "evil.rego": evil}
    for name, text in run.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SpecError) as refused:  # `--policy DIR`: exit 2 before any run
        load_bundle_dir(tmp_path)
    assert "evil.rego: package stackflow_gate" in str(refused.value)
    assert "is reserved for the policy gate" in str(refused.value)
    raw = [Module(policy=f"run/{p}", source=s) for p, s in run.items()]
    with pytest.raises(PolicyError, match=r"^policy run/evil.rego: package stackflow_gate"):
        evaluate_apart([project(), raw], INPUT)  # the worker checks what it evaluates too
    assert decide(project()).outcome == Outcome.denied


def test_a_run_library_of_the_projects_name_changes_nothing_of_the_projects() -> None:
    """The run brings its own `stackflow.lib` whose `approved_change` always holds, and a
    policy importing it (so it is a library of its own bundle): on the old engine both
    libraries were one package and the project's denial passed."""
    run = modules(
        "run",
        {
            "mine.rego": "package stackflow\n\nimport data.stackflow.lib\n\n"
            'warn contains "mine" if lib.approved_change(input.changes[0])\n',
            "lib.rego": "package stackflow.lib\n\napproved_change(_) := true\n",
        },
    )
    decision = decide(project(), run)
    assert decision.outcome == Outcome.denied
    assert triples(decision.messages) == {DENIAL}
    assert [(m.policy, m.msg) for m in decision.messages if m.rule == "warn"] == [
        ("run/mine.rego", "mine")
    ]
    assert decision.policies == ["project/gate.rego", "run/mine.rego"]


def test_a_run_policy_adds_a_denial_and_removes_none() -> None:
    run = modules(
        "run",
        {
            "extra.rego": "package stackflow\n\n_reviewed := true\n\n"
            'deny contains "run: no Friday deploys" if true\n',
        },
    )
    decision = decide(project(), run)
    assert decision.outcome == Outcome.denied
    assert triples(decision.messages) == {
        DENIAL,
        ("run/extra.rego", None, "run: no Friday deploys"),
    }
    assert decision.counts == {"deny": 2}


def test_a_stray_run_module_is_an_error_never_a_library(tmp_path: Path) -> None:
    stray = {"gate.rego": "package stackflow\n", "deny.rego": "package stackflow.x\ndeny := 1\n"}
    with pytest.raises(PolicyError) as caught:
        evaluate([Module(policy=f"run/{p}", source=s) for p, s in stray.items()], INPUT)
    assert str(caught.value).startswith(
        "policy run/deny.rego: package stackflow.x is not `package stackflow` and no policy "
        "of this bundle imports it, so it would never be evaluated"
    )


@pytest.mark.parametrize(
    "text",
    [
        PROJECT_GATE.replace("\n", "\r\n"),  # saved on Windows
        "  " + PROJECT_GATE,  # indented
        "\t" + PROJECT_GATE.replace("package stackflow\n", "package\tstackflow # the gate\r\n"),
        "# reviewed changes only\r\n\r\n"
        + PROJECT_GATE.replace("package stackflow", "package\n stackflow"),
    ],
)
def test_a_package_line_in_any_whitespace_is_evaluated(text: str) -> None:
    """On the old engine these were libraries never evaluated: the decision was pass."""
    found = modules("project", {"gate.rego": text, "lib.rego": PROJECT_LIB})
    decision = decide(found)
    assert decision.outcome == Outcome.denied
    assert triples(decision.messages) == {DENIAL}


def test_an_error_row_stays_true_when_the_package_reference_spans_lines() -> None:
    text = "package\nstackflow\n\ndeny contains x if {\n\tx := 1 +\n}\n"
    with pytest.raises(PolicyError, match=r"^policy project/gate.rego:6: rego_parse_error"):
        evaluate([Module(policy="project/gate.rego", source=text)], INPUT)


HEADS = [
    "package stackflow\r\n\r\ndeny contains 1 if true\r\n",
    "   package stackflow\n",
    "\t\tpackage\t\tstackflow\t\t# c\n",
    "package\nstackflow\n",
    "package\r\n  stackflow.lib\n",
    "# a\n# b\r\n\n\tpackage stackflow# c\n",
    "\ufeffpackage stackflow\n",  # a byte-order mark first: OPA skips it
    "package stackflow.lib\n",
    'package stackflow["lib"]\n',
    'package stackflow[ "lib" ]\n',
    "package stackflow[`lib`]\n",
    'package stackflow["a.b"].c\n',
    "package stackflow_gate.p0\n",
    "package data.stackflow\n",  # data.data.stackflow to OPA: not the policy package
    "package stackflow . lib\n",  # refused by OPA
    'package stackflow\n["lib"]\n',  # refused by OPA
    "package stackflow\n.lib\n",  # refused by OPA
    "# only a comment\rpackage stackflow\r",  # CR alone ends no comment: OPA refuses
    "\fpackage stackflow\n",  # refused by OPA
    "package stackflow\ufeff\n",  # refused by OPA
]


@pytest.mark.parametrize("text", HEADS)
def test_the_package_is_the_one_opa_reads(opa: str, tmp_path: Path, text: str) -> None:
    """Whenever OPA parses a module, the gate reads the same package from it (so a policy
    is never taken for a library, nor the other way round)."""
    path = tmp_path / "m.rego"
    path.write_bytes(text.encode())
    parsed = subprocess.run(
        [opa, "parse", "--format", "json", str(path)], capture_output=True, timeout=60, check=False
    )
    try:
        ours: tuple[str, ...] | None = head(text).package
    except RegoLayoutError:
        ours = None
    if parsed.returncode != 0:
        assert b"rego_parse_error" in parsed.stdout + parsed.stderr
        return  # OPA refuses it: the gate's evaluation fails, whatever the gate read
    theirs = tuple(t["value"] for t in json.loads(parsed.stdout)["package"]["path"])
    assert ("data", *(ours or ())) == theirs


# ---- what OPA may reach -------------------------------------------------------------------------
SCHEMA_SECRET = "s3cr3t-from-the-worker-disk"


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    """A worker file a policy would like to read: a JSON schema whose enum holds a secret
    (``json.match_schema`` names the allowed values in its errors)."""
    path = tmp_path / "worker-secret.json"
    schema = {"type": "object", "properties": {"who": {"enum": [SCHEMA_SECRET]}}}
    path.write_text(json.dumps(schema))
    return path


@pytest.mark.parametrize("builtin", ["json.match_schema", "json.verify_schema"])
def test_a_schema_reference_to_a_worker_file_is_refused(
    opa: str, schema_file: Path, tmp_path: Path, builtin: str
) -> None:
    ref = json.dumps({"$ref": f"file://{schema_file}"})
    call = (
        f'{builtin}({{"who": input.requested_by}}, {ref})'
        if "match" in builtin
        else f"{builtin}({ref})"
    )
    policy = f'package stackflow\n\ndeny contains sprintf("%v", [{call}]) if true\n'
    with pytest.raises(PolicyError) as caught:
        evaluate([Module(policy="run/leak.rego", source=policy)], INPUT)
    text = str(caught.value)
    assert text.startswith("policy run/leak.rego:3: rego_type_error: undefined function"), text
    assert builtin in text and SCHEMA_SECRET not in text

    # the control: OPA's default capabilities follow the reference and read the file
    (tmp_path / "leak.rego").write_text(policy)
    query = ["eval", "--format", "json", "--data", str(tmp_path / "leak.rego")]
    stdin = ["--stdin-input", "data.stackflow.deny"]
    leaked = subprocess.run(
        [opa, *query, *stdin], input=INPUT, capture_output=True, timeout=60, check=False
    )
    assert leaked.returncode == 0, leaked.stderr
    said = json.loads(leaked.stdout)["result"][0]["expressions"][0]["value"]
    if "match" in builtin:
        assert SCHEMA_SECRET in said[0]
    else:
        assert said == ["[true, null]"]  # read and compiled: a missing file is an error


HUNGRY = """package stackflow

# 20 million strings in one array, then joined: gigabytes
deny contains count(big) if true

big := concat("", [x | some _ in numbers.range(1, 20000000); x := "0123456789abcdef"])
"""


def test_a_policy_past_the_memory_limit_fails_the_gate_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MEMORY_VAR, "256")
    started = time.monotonic()
    with pytest.raises(PolicyError) as caught:
        evaluate([Module(policy="run/hungry.rego", source=HUNGRY)], INPUT, timeout=120)
    took = time.monotonic() - started
    text = str(caught.value)
    assert text.startswith(
        f"policies stopped OPA at its memory limit of 256 MiB ({MEMORY_VAR}: raise it, or "
        "make the policies take less): "
    ), text
    assert text.endswith("; nothing was judged") and "\n" not in text, text
    assert took < 60, took  # the limit stopped it, not the timeout

    # the same limit lets an ordinary bundle through
    decision = decide(project())
    assert decision.outcome == Outcome.denied and os.environ[MEMORY_VAR] == "256"


@pytest.mark.parametrize(
    "annotation",
    [
        '# METADATA\n# schemas:\n#   - input: {"$ref": "file://SECRET"}\n',
        '#METADATA\r\n#schemas:\r\n#  - input.who: {"$ref": "file://SECRET"}\r\n',
        '# METADATA\n# "\\x73chemas":\n#   - input: {"\\x24ref": "file://SECRET"}\n',  # escaped
        '# METADATA\n# schemas:\n#   - input: {"$ref": "http://127.0.0.1:9/schema.json"}\n',
    ],
)
def test_a_metadata_schema_naming_a_worker_file_or_url_is_refused(
    opa: str, schema_file: Path, tmp_path: Path, annotation: str
) -> None:
    """OPA's compiler loads a ``schemas`` annotation's ``$ref`` file whatever the
    capabilities (the file's first bytes come back in the error): refused before OPA."""
    policy = annotation.replace("SECRET", str(schema_file)) + (
        "package stackflow\n\ndeny contains input.who if true\n"
    )
    with pytest.raises(ValueError) as refused:  # as the API and the CLI take a bundle
        PolicyBundle(modules={"run/a.rego": policy})
    assert problem_of(refused.value).startswith("run/a.rego: row 1: METADATA declares schemas")
    with pytest.raises(PolicyError) as caught:
        evaluate([Module(policy="run/a.rego", source=policy)], INPUT)
    assert "METADATA declares schemas" in str(caught.value)
    assert SCHEMA_SECRET not in str(caught.value)

    # the control: OPA itself, whatever the capabilities, opens what the $ref names
    missing = annotation.replace("SECRET", str(tmp_path / "missing.json"))
    (tmp_path / "a.rego").write_text(missing + "package stackflow\n\ndeny contains 1 if true\n")
    cmd = [opa, "eval", "--format", "json", "--capabilities", capabilities_file(opa)]
    cmd += ["--data", str(tmp_path / "a.rego"), "--stdin-input", "data.stackflow.deny"]
    loaded = subprocess.run(cmd, input=INPUT, capture_output=True, timeout=60, check=False)
    said = (loaded.stdout + loaded.stderr).decode()
    assert "unable to compile the schema" in said, said
    if "http" in annotation:
        assert "remote reference loading disabled" in said  # allow_net: [] holds for URLs
    else:  # but not for files
        assert f"open {tmp_path / 'missing.json'}: no such file or directory" in said
