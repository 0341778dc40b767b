"""Recorded state leaves the store masked: Secret data, runtime-private and recorded paths."""

from __future__ import annotations

from datetime import UTC, datetime

from stackflow.engine.masking import SENSITIVE_MARKER, mask_attributes, masked_release_data
from stackflow.model.release import Phase, Release, State
from stackflow.model.spec import Resource, Spec


def release_of(state: list[Resource], spec: Spec | None = None) -> Release:
    now = datetime.now(UTC)
    return Release(
        project="p",
        workspace="w",
        revision=1,
        phase=Phase.succeeded,
        spec=spec,
        state=State(resources=state),
        created_at=now,
        modified_at=now,
    )


def test_secret_data_is_masked_and_the_rest_kept() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "data": {"password": "aHVudGVyMg=="}}
    masked = mask_attributes("Kubernetes", secret)
    assert masked["data"] == SENSITIVE_MARKER
    assert masked["kind"] == "Secret"
    assert secret["data"] == {"password": "aHVudGVyMg=="}, "the input is not modified"


def test_runtime_private_keys_and_recorded_sensitive_paths_are_masked() -> None:
    attrs = {
        "length": 16,
        "result": "s3cr3t",
        "_stackflow_tfstate": '{"resources": []}',
        "_stackflow_sensitive": ["result"],
    }
    masked = mask_attributes("Terraform", attrs)
    assert masked["result"] == SENSITIVE_MARKER
    assert masked["_stackflow_tfstate"] == SENSITIVE_MARKER
    assert masked["length"] == 16


def test_plain_resources_are_untouched() -> None:
    attrs = {"kind": "File", "path": "/tmp/x", "content": "hello", "mode": "0644"}
    assert mask_attributes("OnPrem", attrs) == attrs


def test_release_json_masks_state_and_spec() -> None:
    secret = Resource(
        id="v1:Secret:ns:s",
        type="Kubernetes",
        attributes={"apiVersion": "v1", "kind": "Secret", "stringData": {"k": "plain"}},
    )
    data = masked_release_data(release_of([secret]))
    assert "plain" not in str(data)
    assert data["state"]["resources"][0]["attributes"]["stringData"] == SENSITIVE_MARKER


def test_values_taken_from_a_secret_are_masked_where_the_state_has_no_marks() -> None:
    """A release as Kusion records it (imported): the ConfigMap holds the Secret's value,
    resolved, with no sensitivity marks; the spec's reference is what says it is secret. The
    Kusion export masks it too."""
    from stackflow.state.kusion import _kusion_document

    secret = Resource(
        id="v1:Secret:ns:s",
        type="Kubernetes",
        attributes={"apiVersion": "v1", "kind": "Secret", "stringData": {"k": "hunter2"}},
    )

    def config_map(value: str) -> Resource:
        return Resource(
            id="v1:ConfigMap:ns:c",
            type="Kubernetes",
            attributes={"apiVersion": "v1", "kind": "ConfigMap", "data": {"copy": value}},
            depends_on=[secret.id],
        )

    release = release_of(
        [secret, config_map("hunter2")],
        Spec(resources=[secret, config_map("$kusion_path.v1:Secret:ns:s.stringData.k")]),
    )
    for data in (masked_release_data(release), _kusion_document(release)):
        assert "hunter2" not in str(data)
    shown = masked_release_data(release)["state"]["resources"][1]["attributes"]
    assert shown["data"] == {"copy": SENSITIVE_MARKER} and shown["kind"] == "ConfigMap"
