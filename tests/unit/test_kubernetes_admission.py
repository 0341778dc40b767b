"""Kubernetes admission denials (a ValidatingAdmissionPolicy's, an admission webhook's) are
policy denials: ``Denied`` (error type ``PolicyDenied``, exit 2, never retried), one line
naming the resource and the policy, the resource's sensitive values masked.

The bodies below are what kube-apiserver v1.37.2 answered a server-side apply (dry run and
real alike) in the dev cluster; tests/integration/test_kubernetes_admission.py meets the
real thing through the CLI.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from stackflow.activities.errors import to_application_error
from stackflow.cli.report import BAD_INPUT_TYPES, workflow_failure
from stackflow.core.errors import SpecError
from stackflow.engine.masking import SENSITIVE_MARKER, mask_text
from stackflow.runtimes.base import (
    Denied,
    InvalidInput,
    ResourceRequest,
    RuntimeOptions,
    Unavailable,
)
from stackflow.runtimes.kubernetes.client import ApiError, KubeClient
from stackflow.runtimes.kubernetes.failures import (
    DENIAL_MESSAGE_LIMIT,
    AdmissionDenial,
    admission_denial,
    failure,
)
from stackflow.runtimes.kubernetes.runtime import KubernetesRuntime
from stackflow.workflows.common import NON_RETRYABLE

JSON = dict[str, Any]
RID = "v1:ConfigMap:team-a:c-forbidden"
SERVER = "https://127.0.0.1:16443"
VAP_422: JSON = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'configmaps "c-forbidden" is forbidden: ValidatingAdmissionPolicy '
    "'sf-vapexp-422' with binding 'sf-vapexp-422-binding' denied request: ConfigMaps "
    "labelled tier=forbidden are not allowed here",
    "reason": "Invalid",
    "details": {
        "name": "c-forbidden",
        "kind": "configmaps",
        "causes": [
            {
                "message": "ValidatingAdmissionPolicy 'sf-vapexp-422' with binding "
                "'sf-vapexp-422-binding' denied request: ConfigMaps labelled tier=forbidden "
                "are not allowed here"
            }
        ],
    },
    "code": 422,
}
VAP_403: JSON = {  # the validation's reason: Forbidden
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'configmaps "c-forbidden403" is forbidden: ValidatingAdmissionPolicy '
    "'sf-vapexp-403' with binding 'sf-vapexp-403-binding' denied request: tier forbidden403 "
    "is refused for c-forbidden403",
    "reason": "Forbidden",
    "details": {
        "name": "c-forbidden403",
        "kind": "configmaps",
        "causes": [
            {
                "message": "ValidatingAdmissionPolicy 'sf-vapexp-403' with binding "
                "'sf-vapexp-403-binding' denied request: tier forbidden403 is refused for "
                "c-forbidden403"
            }
        ],
    },
    "code": 403,
}
VAP_EXPRESSION_ERROR: JSON = {  # failurePolicy Fail: an expression that errs denies too
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "secrets \"s2\" is forbidden: ValidatingAdmissionPolicy 'sf-vapexp-secret' "
    "with binding 'sf-vapexp-secret-binding' denied request: expression "
    "'object.metadata.labels['nope'] == 'x'' resulted in error: no such key: nope",
    "reason": "Invalid",
    "details": {"name": "s2", "kind": "secrets", "causes": [{"message": "..."}]},
    "code": 422,
}
WEBHOOK_400: JSON = {  # the webhook set no code: 400; its message has a newline
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'admission webhook "deny.sf-vapexp.stackflow.test" denied the request: '
    "ConfigMaps named deny-* are refused\nby policy",
    "code": 400,
}
WEBHOOK_403: JSON = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'admission webhook "deny.sf-vapexp.stackflow.test" denied the request: not here',
    "reason": "Forbidden",
    "code": 403,
}
WEBHOOK_SILENT: JSON = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'admission webhook "deny.sf-vapexp.stackflow.test" denied the request without '
    "explanation",
    "code": 400,
}
LABEL_422: JSON = {  # no admission: the object itself is invalid
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'ConfigMap "bad" is invalid: metadata.labels: Invalid value: "-bad value-": a '
    "valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
    "reason": "Invalid",
    "details": {
        "name": "bad",
        "kind": "ConfigMap",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "-bad value-": a valid label must be ...',
                "field": "metadata.labels",
            }
        ],
    },
    "code": 422,
}
RBAC_403: JSON = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'configmaps "c" is forbidden: User "dev" cannot patch resource "configmaps" in '
    'API group "" in the namespace "team-a"',
    "reason": "Forbidden",
    "details": {"name": "c", "kind": "configmaps"},
    "code": 403,
}


def api_error(body: JSON) -> ApiError:
    return ApiError(int(body["code"]), copy.deepcopy(body), "", SERVER)


# ---- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            VAP_422,
            AdmissionDenial(
                "ValidatingAdmissionPolicy",
                "sf-vapexp-422",
                "sf-vapexp-422-binding",
                "ConfigMaps labelled tier=forbidden are not allowed here",
            ),
        ),
        (
            VAP_403,
            AdmissionDenial(
                "ValidatingAdmissionPolicy",
                "sf-vapexp-403",
                "sf-vapexp-403-binding",
                "tier forbidden403 is refused for c-forbidden403",
            ),
        ),
        (
            VAP_EXPRESSION_ERROR,
            AdmissionDenial(
                "ValidatingAdmissionPolicy",
                "sf-vapexp-secret",
                "sf-vapexp-secret-binding",
                "expression 'object.metadata.labels['nope'] == 'x'' resulted in error: "
                "no such key: nope",
            ),
        ),
        (
            WEBHOOK_400,
            AdmissionDenial(
                "AdmissionWebhook",
                "deny.sf-vapexp.stackflow.test",
                None,
                "ConfigMaps named deny-* are refused\nby policy",
            ),
        ),
        (
            WEBHOOK_403,
            AdmissionDenial("AdmissionWebhook", "deny.sf-vapexp.stackflow.test", None, "not here"),
        ),
        (
            WEBHOOK_SILENT,
            AdmissionDenial("AdmissionWebhook", "deny.sf-vapexp.stackflow.test", None, ""),
        ),
    ],
)
def test_admission_denials_as_the_api_server_words_them(
    body: JSON, expected: AdmissionDenial
) -> None:
    assert admission_denial(api_error(body)) == expected


def test_a_denial_without_binding_or_object_name_is_still_one() -> None:
    # admission.NewForbidden leaves the name out when the request has none (generateName)
    body = {
        "message": "configmaps is forbidden: ValidatingAdmissionPolicy 'p' denied request: no",
        "reason": "Invalid",
        "code": 422,
    }
    assert admission_denial(ApiError(422, body, "")) == AdmissionDenial(
        "ValidatingAdmissionPolicy", "p", None, "no"
    )


@pytest.mark.parametrize("body", [LABEL_422, RBAC_403])
def test_other_refusals_are_no_admission_denial(body: JSON) -> None:
    assert admission_denial(api_error(body)) is None


def test_only_a_whole_message_of_the_server_is_a_denial() -> None:
    # a field value quoting a denial is not one; nor is a retryable status
    quoted = (
        'ConfigMap "x" is invalid: metadata.labels: Invalid value: "ValidatingAdmissionPolicy '
        "'p' with binding 'b' denied request: m\""
    )
    assert admission_denial(ApiError(422, {"message": quoted}, "")) is None
    webhook = 'admission webhook "w" denied the request: busy'
    assert admission_denial(ApiError(429, {"message": webhook}, "")) is None
    assert admission_denial(ApiError(503, {"message": webhook}, "")) is None
    assert admission_denial(ApiError(400, {"message": webhook}, "")) is not None


# ---- the runtime's error -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            VAP_422,
            f"{RID}: denied by Kubernetes ValidatingAdmissionPolicy 'sf-vapexp-422' (binding "
            "'sf-vapexp-422-binding'): ConfigMaps labelled tier=forbidden are not allowed here",
        ),
        (
            VAP_403,
            f"{RID}: denied by Kubernetes ValidatingAdmissionPolicy 'sf-vapexp-403' (binding "
            "'sf-vapexp-403-binding'): tier forbidden403 is refused for c-forbidden403",
        ),
        (
            WEBHOOK_400,
            f"{RID}: denied by Kubernetes admission webhook 'deny.sf-vapexp.stackflow.test': "
            "ConfigMaps named deny-* are refused by policy",
        ),
        (
            WEBHOOK_SILENT,
            f"{RID}: denied by Kubernetes admission webhook 'deny.sf-vapexp.stackflow.test' "
            "without explanation",
        ),
    ],
)
def test_a_denial_is_denied_one_line_naming_resource_and_policy(body: JSON, line: str) -> None:
    exc = failure(api_error(body), RID, "dry-run apply of ConfigMap team-a/c-forbidden")
    assert type(exc) is Denied and exc.kind == "PolicyDenied" and not exc.retryable
    assert str(exc) == line and exc.resource_id == RID


def test_a_non_admission_422_stays_what_it_was() -> None:
    exc = failure(api_error(LABEL_422), "v1:ConfigMap:ns:bad", "dry-run apply of ConfigMap ns/bad")
    assert type(exc) is InvalidInput
    assert str(exc) == (
        "v1:ConfigMap:ns:bad: dry-run apply of ConfigMap ns/bad rejected by the API server, "
        'invalid metadata.labels: ConfigMap "bad" is invalid: metadata.labels: Invalid value: '
        '"-bad value-": a valid label must be an empty string or consist of alphanumeric '
        "characters, '-', '_' or '.', and must start and end with an alphanumeric character "
        "(e.g. 'MyValue', or 'my_value', or '12345', regex used for validation is "
        "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    )
    rbac = failure(api_error(RBAC_403), RID, "apply")
    assert type(rbac) is InvalidInput and "lacks RBAC permission" in str(rbac)
    terminating = {
        "message": 'configmaps "c" is forbidden: unable to create new content in namespace '
        "team-a because it is being terminated",
        "reason": "Forbidden",
        "code": 403,
    }
    assert type(failure(ApiError(403, terminating, ""), RID, "apply")) is Unavailable


def test_control_characters_are_stripped_and_the_message_capped() -> None:
    message = "bad\x1b[2J\u202eevil\x00 " + "x" * 1000
    body = {
        "message": f"configmaps \"c\" is forbidden: ValidatingAdmissionPolicy 'p\x07' with "
        f"binding 'b' denied request: {message}",
        "code": 422,
    }
    text = str(failure(ApiError(422, body, ""), RID, "apply"))
    assert text.startswith(f"{RID}: denied by Kubernetes ValidatingAdmissionPolicy 'p' ")
    assert text.isprintable() and "bad[2Jevil x" in text
    said = text.split("(binding 'b'): ", 1)[1]
    assert len(said) == DENIAL_MESSAGE_LIMIT and said.endswith("…")


def secret_request(**extra: Any) -> ResourceRequest:
    data = {"token": base64.b64encode(b"tok-en-v4lue").decode(), "pin": "MTIzNA=="}  # 1234
    obj = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "team-a", "labels": {"tier": "forbidden"}},
        "type": "Opaque",
        "data": data,
        "stringData": {"password": "hunter2-very-secret", "short": "ab"},
    }
    return ResourceRequest(id="v1:Secret:team-a:creds", type="Kubernetes", attributes=obj, **extra)


SECRETS = (
    "hunter2-very-secret",
    base64.b64encode(b"hunter2-very-secret").decode(),
    "tok-en-v4lue",
    base64.b64encode(b"tok-en-v4lue").decode(),
    "MTIzNA==",
)


def test_a_secrets_values_never_appear_in_a_denial() -> None:
    resource = secret_request()
    said = (
        f"password {SECRETS[0]} ({SECRETS[1]}) and token {SECRETS[2]} ({SECRETS[3]}) are weak; "
        "pin 1234 too; short ab, not abc; absent 'x'"
    )
    body = {
        "message": "secrets \"creds\" is forbidden: ValidatingAdmissionPolicy 'weak' with "
        f"binding 'weak-b' denied request: {said}",
        "reason": "Invalid",
        "code": 422,
    }
    text = str(failure(ApiError(422, body, ""), resource.id, "apply", resource))
    for value in (*SECRETS, "1234", " ab,"):
        assert value not in text
    m = SENSITIVE_MARKER
    assert text == (
        "v1:Secret:team-a:creds: denied by Kubernetes ValidatingAdmissionPolicy 'weak' "
        f"(binding 'weak-b'): password {m} ({m}) and token {m} ({m}) are weak; pin {m} too; "
        f"short {m}, not abc; absent 'x'"
    )


def test_values_taken_from_a_sensitive_one_are_masked_in_any_kind() -> None:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "team-a"},
        "data": {"dsn": "postgres://app:s3cr3t-pw@db/app", "mode": "fast"},
    }
    text = mask_text('the dsn "postgres://app:s3cr3t-pw@db/app" in mode fast', obj, ["data.dsn"])
    assert text == f'the dsn "{SENSITIVE_MARKER}" in mode fast'


# ---- end to end through the runtime and the error chain ------------------------------------


class Refusing(KubeClient):
    """An API server serving Secrets whose admission refuses every write with ``refusal``."""

    def __init__(self, refusal: JSON, live: JSON | None = None) -> None:
        super().__init__(api=None, label=SERVER)  # type: ignore[arg-type]
        self.refusal, self.live = refusal, live

    def exchange(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: JSON | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, JSON]:
        return 200, self._answer(method, path)

    def _answer(self, method: str, path: str) -> JSON:
        if method == "GET" and path == "/api/v1":
            return {"resources": [{"name": "secrets", "kind": "Secret", "namespaced": True}]}
        if method == "GET":
            if self.live is not None:
                return self.live
            raise ApiError(404, {"reason": "NotFound", "message": "not found"}, "", SERVER)
        raise ApiError(int(self.refusal["code"]), copy.deepcopy(self.refusal), "", SERVER)

    def close(self) -> None:
        pass


WEAK: JSON = {
    "kind": "Status",
    "status": "Failure",
    "message": "secrets \"creds\" is forbidden: ValidatingAdmissionPolicy 'weak' with binding "
    f"'weak-b' denied request: secret password {SECRETS[1]} is too weak",
    "reason": "Invalid",
    "code": 422,
}


@pytest.mark.parametrize("step", ["preview", "apply", "delete"])
async def test_preview_apply_and_delete_raise_denied_masked(step: str) -> None:
    resource = secret_request()
    live = None
    if step == "delete":
        live = {**resource.attributes, "metadata": {"name": "creds", "uid": "u1"}}
    rt = KubernetesRuntime()
    client = Refusing(WEAK, live)
    rt.client_for = lambda resource, options: client  # type: ignore[method-assign]
    options = RuntimeOptions(project="shop", workspace="prod", adopt=True)
    try:
        with pytest.raises(Denied) as err:
            await getattr(rt, step)(resource, options)
    finally:
        await rt.close()
    text = str(err.value)
    assert text == (
        "v1:Secret:team-a:creds: denied by Kubernetes ValidatingAdmissionPolicy 'weak' "
        f"(binding 'weak-b'): secret password {SENSITIVE_MARKER} is too weak"
    )
    # leaves the activity as PolicyDenied, never retried; the CLI exits 2
    application = to_application_error(err.value)
    assert isinstance(application, ApplicationError)
    assert application.type == "PolicyDenied" and application.non_retryable
    assert application.message == text
    assert "PolicyDenied" in NON_RETRYABLE and "PolicyDenied" in BAD_INPUT_TYPES
    cli = workflow_failure("PreviewWorkflow", text, "PolicyDenied")
    assert isinstance(cli, SpecError) and cli.exit_code == 2
