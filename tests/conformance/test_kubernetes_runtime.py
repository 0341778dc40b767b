"""The Kubernetes runtime passes the runtime conformance suite against the dev cluster
(`make up`; ``KUBECONFIG`` from `make -s env`), on ConfigMaps of the default namespace."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from tests.conformance.runtime_suite import RuntimeCase, RuntimeSuite

pytestmark = pytest.mark.integration


def config_map(name: str, data: dict[str, str], **extensions: str) -> ResourceRequest:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": data,
    }
    return ResourceRequest(
        id=f"v1:ConfigMap:default:{name}",
        type="Kubernetes",
        attributes=manifest,
        extensions=extensions,
    )


class TestKubernetesRuntime(RuntimeSuite):
    @pytest.fixture
    def case(self, tmp_path: Path) -> RuntimeCase:
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig or not Path(kubeconfig).is_file():
            pytest.fail(
                'KUBECONFIG is not set: start the services with `make up` and `eval "$(make -s '
                'env)"` (or run `make test`)',
                pytrace=False,
            )
        run = uuid.uuid4().hex[:8]
        stranger = tmp_path / "other-kubeconfig"
        stranger.write_text("apiVersion: v1\nkind: Config\n")

        def invalid(name: str) -> ResourceRequest:
            bad = config_map(f"sf-{run}-{name}", {"k": "v"})
            return bad.model_copy(update={"attributes": {**bad.attributes, "data": "not a map"}})

        return RuntimeCase(
            type_name="Kubernetes",
            options=RuntimeOptions(project=f"conf{run}", workspace="dev", timeout_seconds=60),
            make=lambda name: config_map(f"sf-{run}-{name}", {"k": "one"}),
            change=lambda r: r.model_copy(
                update={"attributes": {**r.attributes, "data": {"k": "two"}}}
            ),
            invalid=invalid,
            refused=lambda name: config_map(
                f"sf-{run}-{name}", {"k": "v"}, kubeConfig=str(stranger)
            ),
            observed=lambda live: live.get("data"),
        )
