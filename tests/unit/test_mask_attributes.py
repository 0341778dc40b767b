"""Recorded state leaves the store masked: Secret data, runtime-private and recorded paths."""

from __future__ import annotations

from datetime import UTC, datetime

from cli.output import masked_release_json
from stackflow.diff import SENSITIVE_MARKER, mask_attributes
from stackflow.release import Phase, Release, State
from stackflow.spec import Resource


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
    now = datetime.now(UTC)
    release = Release(
        project="p",
        workspace="w",
        revision=1,
        phase=Phase.succeeded,
        state=State(resources=[secret]),
        created_at=now,
        modified_at=now,
    )
    data = masked_release_json(release)
    assert "plain" not in str(data)
    assert data["state"]["resources"][0]["attributes"]["stringData"] == SENSITIVE_MARKER
