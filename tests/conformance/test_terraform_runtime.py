"""The Terraform runtime passes the runtime conformance suite with the offline OpenTofu of
`make setup` (``STACKFLOW_TF_BIN`` from `make -s env`) and the built-in ``terraform_data``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from tests.conformance.runtime_suite import RuntimeCase, RuntimeSuite

pytestmark = pytest.mark.integration

BUILTIN = {"provider": "terraform.io/builtin/terraform", "resourceType": "terraform_data"}


def data(
    name: str, value: object, extensions: dict[str, str] = BUILTIN, **more: object
) -> ResourceRequest:
    return ResourceRequest(
        id=f"builtin:terraform:terraform_data:{name}",
        type="Terraform",
        attributes={"input": {"value": value}, **more},
        extensions=dict(extensions),
    )


class TestTerraformRuntime(RuntimeSuite):
    @pytest.fixture
    def case(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RuntimeCase:
        tf_bin = os.environ.get("STACKFLOW_TF_BIN")
        if not tf_bin or not os.access(tf_bin, os.X_OK):
            pytest.fail(
                "STACKFLOW_TF_BIN is not set or not executable: run `make setup` and "
                '`eval "$(make -s env)"`',
                pytrace=False,
            )
        monkeypatch.setenv("STACKFLOW_HOME", str(tmp_path / "home"))
        return RuntimeCase(
            type_name="Terraform",
            options=RuntimeOptions(project="conformance", workspace="tf", timeout_seconds=120),
            make=lambda name: data(name, "one"),
            change=lambda r: r.model_copy(update={"attributes": {"input": {"value": "two"}}}),
            invalid=lambda name: data(name, "x", {"provider": "not a provider source"}),
            refused=lambda name: data(
                name, "x", provisioner={"local-exec": {"command": "touch /tmp/owned"}}
            ),
            observed=lambda live: live.get("output"),
        )
