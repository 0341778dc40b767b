"""The OnPrem runtime passes the runtime conformance suite, on files in a temporary root."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackflow.runtimes.base import ResourceRequest, RuntimeOptions
from tests.conformance.runtime_suite import RuntimeCase, RuntimeSuite


def file(rid: str, path: Path | str, content: str, **more: object) -> ResourceRequest:
    attributes = {"kind": "File", "path": str(path), "content": content, **more}
    return ResourceRequest(id=rid, type="OnPrem", attributes=attributes)


class TestOnPremRuntime(RuntimeSuite):
    @pytest.fixture
    def case(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RuntimeCase:
        root = tmp_path / "root"
        root.mkdir()
        monkeypatch.setenv("STACKFLOW_ONPREM_ROOTS", str(root))
        return RuntimeCase(
            type_name="OnPrem",
            options=RuntimeOptions(project="conformance", workspace="onprem"),
            make=lambda name: file(f"onprem:File:{name}", root / name, "one\n", mode="0640"),
            change=lambda r: r.model_copy(
                update={"attributes": {**r.attributes, "content": "two\n"}}
            ),
            invalid=lambda name: file(f"onprem:File:{name}", root / name, "x", kind="Socket"),
            refused=lambda name: file(f"onprem:File:{name}", tmp_path / name, "outside the root"),
            observed=lambda live: (live.get("content"), live.get("mode")),
        )
