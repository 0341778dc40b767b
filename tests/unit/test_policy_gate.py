"""The policy gate's pure parts: bundles (what a directory may hold, content addressing),
decisions (outcome order, message shapes, the byte budget), the notification a denial
makes. The engine itself (OPA) is exercised in tests/integration/test_policy_*.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from stackflow.core.errors import SpecError
from stackflow.model.events import EventType
from stackflow.model.notifications import TYPES, cloud_type
from stackflow.model.policy import (
    MESSAGE_LIMIT,
    MESSAGES_LIMIT,
    Outcome,
    PolicyDecision,
    PolicyMessage,
    Rule,
    messages_of,
)
from stackflow.policy_gate.bundle import PolicyBundle, fetch_bundle, load_bundle_dir
from stackflow.policy_gate.engine import MEMORY_VAR, PolicyEngineMissing, limited, memory_mb
from stackflow.policy_gate.rego import RegoLayoutError, layout

MODULE = "package stackflow\n"


def decide(*messages: PolicyMessage) -> PolicyDecision:
    return PolicyDecision.of(
        list(messages),
        bundles=[],
        input_digest="sha256:" + "0" * 64,
        policies=["project/a.rego"],
        evaluated_at=None,
        duration_ms=1,
    )


def msg(rule: Rule, text: str = "m", resource: str | None = None) -> PolicyMessage:
    return PolicyMessage(policy="project/a.rego", rule=rule, msg=text, resource=resource)


def test_a_directory_bundle_takes_rego_files_and_leaves_tests_out(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "a.rego").write_text(MODULE + "import data.stackflow.lib\n")
    (tmp_path / "lib" / "k8s.rego").write_text("package stackflow.lib\n")
    (tmp_path / "a_test.rego").write_text(MODULE)
    (tmp_path / "README.md").write_text("not a module")
    bundle = load_bundle_dir(tmp_path)
    assert list(bundle.modules) == ["a.rego", "lib/k8s.rego"]
    again = PolicyBundle(modules=dict(reversed(list(bundle.modules.items()))))
    assert again.digest == bundle.digest and again.to_bytes() == bundle.to_bytes()
    assert PolicyBundle.from_bytes(bundle.to_bytes()) == bundle


@pytest.mark.parametrize(
    ("setup", "problem"),
    [
        (lambda d: None, "no .rego files"),
        (lambda d: (d / "a.rego").write_bytes(b"\xff\xfe"), "not UTF-8"),
        (lambda d: os.symlink("/etc/passwd", d / "a.rego"), "symlinks are refused"),
        (lambda d: (d / "a.rego").write_text("x" * (1024 * 1024 + 1)), "larger than"),
    ],
)
def test_a_directory_that_cannot_be_a_bundle_is_one_line(
    tmp_path: Path, setup: object, problem: str
) -> None:
    setup(tmp_path)  # type: ignore[operator]
    with pytest.raises(SpecError, match=problem):
        load_bundle_dir(tmp_path)
    with pytest.raises(SpecError, match="not a directory"):
        load_bundle_dir(tmp_path / "missing")


@pytest.mark.parametrize(
    "path", ["../a.rego", "/etc/a.rego", "a.txt", "a//b.rego", "\x1b[2Ja.rego", "x" * 201 + ".rego"]
)
def test_bundle_paths_stay_inside(path: str) -> None:
    with pytest.raises(ValidationError):
        PolicyBundle(modules={path: MODULE})


def test_a_module_named_with_control_characters_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "\x1b[2Jevil.rego").write_text(MODULE)
    with pytest.raises(SpecError, match="printable characters"):
        load_bundle_dir(tmp_path)


def test_deny_wins_then_approval_then_warn() -> None:
    assert decide().outcome == Outcome.passed
    assert decide(msg(Rule.warn)).outcome == Outcome.warned
    assert decide(msg(Rule.warn), msg(Rule.require_approval)).outcome == Outcome.approval
    both = decide(msg(Rule.warn), msg(Rule.require_approval), msg(Rule.deny, "no", "r1"))
    assert both.outcome == Outcome.denied
    assert [m.rule for m in both.messages] == [Rule.deny, Rule.require_approval, Rule.warn]
    assert both.counts == {"deny": 1, "require_approval": 1, "warn": 1}
    assert both.denial_line() == "policy denied: project/a.rego: no"


def test_rule_values_of_every_shape_become_messages() -> None:
    found = messages_of(
        "p",
        Rule.deny,
        ["plain", {"msg": "obj", "resource": "r"}, {"other": 1}, 7, True],
    )
    assert [(m.msg, m.resource) for m in found] == [
        ("plain", None),
        ("obj", "r"),
        ('{"other": 1}', None),
        ("7", None),
        ("deny holds", None),
    ]
    assert messages_of("p", Rule.warn, None) == [] and messages_of("p", Rule.warn, False) == []
    long = messages_of("p", Rule.warn, ["\x1b[31mred\n" + "x" * 1000])[0].msg
    assert "\x1b" not in long and "\n" not in long and len(long) == MESSAGE_LIMIT


def test_a_long_decision_keeps_the_first_messages_and_every_count() -> None:
    many = decide(*(msg(Rule.deny, f"m{i:03d}", f"r{i}") for i in range(50)))
    brief = many.brief("sha256:" + "1" * 64)
    assert len(brief.messages) == MESSAGES_LIMIT and brief.counts == {"deny": 50}
    assert brief.full_ref == "sha256:" + "1" * 64
    assert brief.denial_line().endswith("(and 49 more)")
    assert decide(msg(Rule.warn)).brief(None).full_ref is None


def test_only_a_denial_is_announced() -> None:
    assert "io.stackflow.run.policy_denied" in TYPES
    kind = cloud_type(EventType.policy_decision, {"outcome": "deny"})
    assert kind == "io.stackflow.run.policy_denied"
    for outcome in ("pass", "warn", "require_approval"):
        assert cloud_type(EventType.policy_decision, {"outcome": outcome}) is None


# ---- what a module is, read as OPA reads it ----------------------------------------------------
DENY = 'deny contains "no" if input.x\n'


@pytest.mark.parametrize(
    "text",
    [
        "package stackflow\r\n\r\nimport rego.v1\r\n" + DENY.replace("\n", "\r\n"),  # Windows
        "   package stackflow\n" + DENY,  # indented
        "\tpackage\tstackflow\t# the gate\n" + DENY,
        "# a comment first\r\n\r\n  package   stackflow  \r\n" + DENY,
        "package\nstackflow\n" + DENY,  # Rego lets the reference follow on the next line
        'package stackflow\n\nx := "package stackflow.lib"\n' + DENY,
    ],
)
def test_a_package_stackflow_line_makes_a_policy_whatever_its_whitespace(text: str) -> None:
    heads = layout({"a.rego": text})
    assert heads["a.rego"].is_policy
    start, end = heads["a.rego"].span
    assert text[start:end].split() == ["stackflow"]


@pytest.mark.parametrize(
    ("policy", "library"),
    [
        ("import data.stackflow.lib\n", "package stackflow.lib\n"),
        ("import data.stackflow.lib as helpers\n", "package stackflow.lib\n"),
        ('import data.stackflow["lib"]\n', "package stackflow.lib\n"),
        ("import data.stackflow\n", "package stackflow.lib.k8s\n"),  # a prefix reaches it
        ("x := data.shared.util.f(1)\n", "package shared.util\n"),  # a reference in a rule
        ("import data.stackflow.lib.k8s\n", "package stackflow.lib\n"),  # one of its rules
    ],
)
def test_a_library_a_policy_reaches_is_one(policy: str, library: str) -> None:
    heads = layout({"a.rego": "package stackflow\n" + policy, "lib.rego": library})
    assert heads["a.rego"].is_policy and not heads["lib.rego"].is_policy


def test_a_library_reached_through_another_library_is_one() -> None:
    heads = layout(
        {
            "a.rego": "package stackflow\nimport data.stackflow.lib\n",
            "lib.rego": "package stackflow.lib\nimport data.deep.helpers\n",
            "deep.rego": "package deep.helpers\n",
        }
    )
    assert set(heads) == {"a.rego", "lib.rego", "deep.rego"}


@pytest.mark.parametrize(
    ("modules", "problem"),
    [
        (  # a stray module: never evaluated, never silently a library
            {"a.rego": "package stackflow\n", "b.rego": "package stackflow.deny\n" + DENY},
            "b.rego: package stackflow.deny is not `package stackflow` and no policy of "
            "this bundle imports it",
        ),
        (  # referred to only in a comment or a string
            {
                "a.rego": 'package stackflow\n# data.lib.x\nx := "data.lib.y"\n',
                "b.rego": "package lib\n",
            },
            "b.rego: package lib is not `package stackflow`",
        ),
        (  # libraries that only reach each other
            {
                "a.rego": "package one\nimport data.two\n",
                "b.rego": "package two\nimport data.one\n",
            },
            "a.rego: package one is not",
        ),
        ({"a.rego": DENY}, "a.rego: does not start with a package declaration"),
        ({"a.rego": ""}, "a.rego: does not start with a package declaration"),
        (  # the gate's namespace: a module there would merge into a policy of its own
            {"a.rego": "package stackflow\n", "b.rego": "package stackflow_gate.p0\n_ok := true\n"},
            "b.rego: package stackflow_gate.p0 is reserved for the policy gate",
        ),
        (
            {
                "a.rego": "package stackflow\nimport data.stackflow_gate\n",
                "b.rego": 'package stackflow_gate["p0"]\n',
            },
            "b.rego: package stackflow_gate.p0 is reserved",
        ),
        (
            {"a.rego": "\r\n  package stackflow_gate\r\n"},
            "a.rego: package stackflow_gate is reserved",
        ),
    ],
)
def test_a_module_the_gate_cannot_judge_is_refused_naming_it(
    modules: dict[str, str], problem: str, tmp_path: Path
) -> None:
    with pytest.raises(RegoLayoutError) as caught:
        layout(modules)
    assert str(caught.value).startswith(problem), caught.value
    with pytest.raises(ValidationError, match="package"):
        PolicyBundle(modules=modules)
    for name, text in modules.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SpecError) as refused:
        load_bundle_dir(tmp_path)
    line = str(refused.value)
    assert line.startswith(f"policy bundle {tmp_path}: {problem}"), line
    assert "\n" not in line and "input_value" not in line and len(line) < 700


def test_a_stored_bundle_that_is_no_longer_one_fails_naming_the_module() -> None:
    """A bundle stored before these checks (a stray module) is refused as it is read back:
    the run fails saying which module, never evaluates it as it stands."""
    body = json.dumps({"modules": {"a.rego": MODULE, "b.rego": "package x\n"}}).encode()

    class Blobs:
        def get_blob(self, kind: str, digest: str) -> bytes:
            return body

    with pytest.raises(SpecError, match=r"policy bundle sha256:1+: b\.rego: package x is not"):
        fetch_bundle(Blobs(), "sha256:" + "1" * 64)  # type: ignore[arg-type]


def test_opas_memory_limit_is_set_in_the_child_before_exec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MEMORY_VAR, raising=False)
    assert memory_mb() == 1024
    cmd = limited(["/opt/opa", "eval", "x y"], memory_mb())
    assert cmd[:2] == ["/bin/sh", "-c"] and "ulimit -d" in cmd[2] and 'exec "$@"' in cmd[2]
    assert cmd[4:] == [str(1024 * 1024), "/opt/opa", "eval", "x y"]  # KiB, then OPA as given
    for bad, problem in [("lots", "is not a number of MiB"), ("64", "at least 128")]:
        monkeypatch.setenv(MEMORY_VAR, bad)
        with pytest.raises(PolicyEngineMissing, match=f"{MEMORY_VAR}=.*{problem}"):
            memory_mb()


def test_metadata_without_schemas_is_kept_and_with_them_refused() -> None:
    titled = "# METADATA\n# title: images\n# custom:\n#   severity: high\npackage stackflow\n"
    assert layout({"a.rego": titled})["a.rego"].is_policy
    in_a_string = 'package stackflow\n\nx := "# METADATA"\n# schemas: []\n'
    assert layout({"a.rego": in_a_string})["a.rego"].is_policy
    for text in (
        "package stackflow\n# METADATA\n# schemas:\n#  - input: {}\ndeny contains 1 if true\n",
        '# METADATAX\r\n# "\\x73chemas": []\r\npackage stackflow\r\n',
        "# METADATA\n# title: [unclosed\npackage stackflow\n",
    ):
        with pytest.raises(RegoLayoutError, match=r"^a\.rego: row \d: (METADATA declares|a META)"):
            layout({"a.rego": text})
