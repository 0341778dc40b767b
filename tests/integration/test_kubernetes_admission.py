"""A Kubernetes admission denial is a policy denial, end to end: the real CLI and worker,
Temporal, and kube-apiserver's own ValidatingAdmissionPolicy admission.

Each test has its own namespace and policies (ValidatingAdmissionPolicy and binding,
``validationActions: [Deny]``, bound to that namespace only), removed afterwards. A policy
takes a moment to take effect: the fixture polls a server-side dry-run create until it is
denied.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from stackflow.engine.masking import SENSITIVE_MARKER
from tests.integration.conftest import WorkerProcess, run_cli
from tests.integration.kubehelp import config_map, kusion_id, resource, secret, suffix, wait_for
from tests.integration.opshelp import new_project, write_spec

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
POLICY_WAIT_SECONDS = 30.0
FORBIDDEN_MESSAGE = "ConfigMaps labelled tier=forbidden are not allowed in this namespace"


@dataclass(frozen=True)
class Policies:
    namespace: str
    policy: str
    binding: str
    secret_policy: str
    secret_binding: str


def _body(obj: Obj) -> Any:
    """``obj`` as a request body of the typed client (which sends a plain JSON object as is)."""
    return obj


def _labelled(obj: Obj, **labels: str) -> Obj:
    obj["metadata"]["labels"] = labels
    return obj


def _policy(name: str, resources: str, expression: str, **message: str) -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [resources],
                    }
                ]
            },
            "validations": [{"expression": expression, **message}],
        },
    }


def _binding(name: str, policy: str, namespace: str) -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }


def _not_tier(value: str) -> str:
    labels = "object.metadata.labels"
    return f"!has({labels}) || !('tier' in {labels}) || {labels}['tier'] != '{value}'"


def _denied_by(policy: str, create: Any) -> str | None:
    """The dry-run create's denial naming ``policy``; None while it is let through."""
    try:
        create()
    except k8s.ApiException as exc:
        body = json.loads(exc.body or "{}")
        message = str(body.get("message") or "")
        if f"ValidatingAdmissionPolicy '{policy}'" in message:
            return message
        raise
    return None


@pytest.fixture
def policies(api: k8s.ApiClient) -> Iterator[Policies]:
    admission = k8s.AdmissionregistrationV1Api(api)
    served = {r.name for r in admission.get_api_resources().resources}
    if "validatingadmissionpolicies" not in served:
        pytest.fail(
            "the dev kube-apiserver does not serve admissionregistration.k8s.io/v1 "
            f"validatingadmissionpolicies (it serves {sorted(served)})",
            pytrace=False,
        )
    core = k8s.CoreV1Api(api)
    tag = suffix()
    found = Policies(
        namespace=f"sf-adm-{tag}",
        policy=f"sf-adm-{tag}-tier",
        binding=f"sf-adm-{tag}-tier-binding",
        secret_policy=f"sf-adm-{tag}-weak",
        secret_binding=f"sf-adm-{tag}-weak-binding",
    )
    ns = found.namespace
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
        admission.create_validating_admission_policy(
            _body(
                _policy(
                    found.policy, "configmaps", _not_tier("forbidden"), message=FORBIDDEN_MESSAGE
                )
            )
        )
        admission.create_validating_admission_policy_binding(
            _body(_binding(found.binding, found.policy, ns))
        )
        # a policy whose message quotes the Secret's data (as the API server holds it)
        admission.create_validating_admission_policy(
            _body(
                _policy(
                    found.secret_policy,
                    "secrets",
                    _not_tier("weak"),
                    messageExpression="'the password ' + string(object.data.password) + ' is weak'",
                )
            )
        )
        admission.create_validating_admission_policy_binding(
            _body(_binding(found.secret_binding, found.secret_policy, ns))
        )
        probe = _labelled(config_map(ns, "probe", {"k": "v"}), tier="forbidden")
        weak = _labelled(secret(ns, "probe", {"password": "probe-password"}), tier="weak")
        wait_for(
            lambda: _denied_by(
                found.policy,
                lambda: core.create_namespaced_config_map(ns, _body(probe), dry_run="All"),
            ),
            timeout=POLICY_WAIT_SECONDS,
            interval=0.25,
            what=f"ValidatingAdmissionPolicy {found.policy} to deny a dry-run create",
        )
        wait_for(
            lambda: _denied_by(
                found.secret_policy,
                lambda: core.create_namespaced_secret(ns, _body(weak), dry_run="All"),
            ),
            timeout=POLICY_WAIT_SECONDS,
            interval=0.25,
            what=f"ValidatingAdmissionPolicy {found.secret_policy} to deny a dry-run create",
        )
        yield found
    finally:
        for binding in (found.binding, found.secret_binding):
            with contextlib.suppress(k8s.ApiException):
                admission.delete_validating_admission_policy_binding(binding)
        for policy in (found.policy, found.secret_policy):
            with contextlib.suppress(k8s.ApiException):
                admission.delete_validating_admission_policy(policy)
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespace(ns)


def _config_maps(api: k8s.ApiClient, ns: str) -> set[str]:
    items = k8s.CoreV1Api(api).list_namespaced_config_map(ns).items
    names = {str(item.metadata.name) for item in items if item.metadata is not None}
    return names - {"kube-root-ca.crt"}


def _exits(proc: Any, code: int) -> Any:
    assert proc.returncode == code, (
        f"exit {proc.returncode} (wanted {code})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def test_an_admission_denial_at_preview_and_apply_is_a_policy_denial(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    api: k8s.ApiClient,
    policies: Policies,
) -> None:
    env, project, ns = stack_env, new_project(), policies.namespace
    allowed = _labelled(config_map(ns, "allowed", {"mode": "fast"}), tier="web")
    forbidden = _labelled(config_map(ns, "forbidden", {"mode": "fast"}), tier="forbidden")
    spec = write_spec(tmp_path / "spec.yaml", [resource(allowed), resource(forbidden)])
    line = (
        f"{kusion_id(forbidden)}: denied by Kubernetes ValidatingAdmissionPolicy "
        f"'{policies.policy}' (binding '{policies.binding}'): {FORBIDDEN_MESSAGE}"
    )

    preview = _exits(run_cli(env, "preview", "-f", str(spec), "--project", project), 2)
    assert line in preview.stderr, preview.stderr
    assert "Traceback" not in preview.stderr + preview.stdout
    assert _config_maps(api, ns) == set()

    applied = _exits(run_cli(env, "apply", "-f", str(spec), "--project", project, "--yes"), 2)
    assert line in applied.stderr, applied.stderr
    assert _config_maps(api, ns) == set()

    as_json = _exits(
        run_cli(env, "apply", "-f", str(spec), "--project", project, "--yes", "-o", "json"), 2
    )
    result = json.loads(as_json.stdout)
    assert (result["phase"], result["error_type"]) == ("failed", "PolicyDenied"), result
    assert line in result["error"] and line in as_json.stderr
    assert _config_maps(api, ns) == set()


def test_what_the_policy_allows_previews_and_applies(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    api: k8s.ApiClient,
    policies: Policies,
) -> None:
    env, project, ns = stack_env, new_project(), policies.namespace
    first = _labelled(config_map(ns, "first", {"mode": "fast"}), tier="web")
    second = _labelled(config_map(ns, "second", {"mode": "safe"}), tier="allowed")
    spec = write_spec(tmp_path / "spec.yaml", [resource(first), resource(second)])
    common = ("-f", str(spec), "--project", project, "-o", "json")

    preview = json.loads(_exits(run_cli(env, "preview", *common), 0).stdout)
    assert sorted(c["action"] for c in preview["changes"]) == ["Create", "Create"]
    assert _config_maps(api, ns) == set()

    applied = json.loads(_exits(run_cli(env, "apply", *common, "--yes"), 0).stdout)
    assert applied["phase"] == "succeeded"
    assert _config_maps(api, ns) == {"first", "second"}


def test_a_denial_quoting_a_secrets_data_shows_none_of_it(
    tmp_path: Path,
    stack_env: dict[str, str],
    worker_process: WorkerProcess,
    api: k8s.ApiClient,
    policies: Policies,
) -> None:
    env, project, ns = stack_env, new_project(), policies.namespace
    password = f"s3cret-{suffix()}"
    weak = _labelled(secret(ns, "creds", {"password": password}), tier="weak")
    spec = write_spec(tmp_path / "spec.yaml", [resource(weak)])
    line = (
        f"{kusion_id(weak)}: denied by Kubernetes ValidatingAdmissionPolicy "
        f"'{policies.secret_policy}' (binding '{policies.secret_binding}'): the password "
        f"{SENSITIVE_MARKER} is weak"
    )
    for args in (("preview",), ("apply", "--yes"), ("apply", "--yes", "-o", "json")):
        proc = _exits(run_cli(env, *args, "-f", str(spec), "--project", project), 2)
        shown = proc.stdout + proc.stderr
        assert line in shown, shown
        for text in (password, base64.b64encode(password.encode()).decode()):
            assert text not in shown
    assert not k8s.CoreV1Api(api).list_namespaced_secret(ns, label_selector="tier=weak").items
