"""`stackflow events` and `--output ndjson` (issue 21), in both modes: directly (the state
backend and Temporal) and through a real `stackflow serve` (STACKFLOW_API_URL). The stream
has its header first, one apply_complete per resource, ends with run_complete, and reads
the same in both modes; the command exits as the run ended."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import run_cli
from tests.integration.opshelp import file_resource, new_project, write_spec
from tests.integration.test_cli_api_mode import Cli, api_cli, api_server, direct

pytestmark = pytest.mark.integration
__all__ = ["api_cli", "api_server"]  # fixtures


def lines_of(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.splitlines()]


def check_stream(lines: list[dict[str, Any]], project: str, ids: list[str], status: str) -> None:
    header, events = lines[0], lines[1:]
    assert header["stream"] == "stackflow.events" and header["version"] == 1
    assert header["project"] == project and header["workspace"] == "default"
    assert [e["seq"] for e in events] == list(
        range(events[0]["seq"], events[0]["seq"] + len(events))
    )
    done = [e["resource"]["id"] for e in events if e["type"] == "apply_complete"]
    assert sorted(done) == sorted(ids)  # one per resource
    assert events[-1]["type"] == "run_complete" and events[-1]["status"] == status
    assert [e["type"] for e in events].count("run_complete") == 1


@pytest.mark.parametrize("mode", ["direct", "api"])
def test_ndjson_apply_streams_the_run_and_events_prints_it_again(
    mode: str, tmp_path: Path, stack_env: dict[str, str], api_cli: Cli
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(direct(stack_env), *args) if mode == "direct" else api_cli(stack_env, *args)

    project = new_project()
    files = [file_resource(tmp_path / "out" / f"f{i}.txt", f"{i}\n") for i in range(4)]
    spec = write_spec(tmp_path / "spec.yaml", files)
    ids = [f["id"] for f in files]
    applied = cli("apply", "-f", str(spec), "-p", project, "--yes", "-o", "ndjson")
    assert applied.returncode == 0, applied.stderr
    streamed = lines_of(applied)
    check_stream(streamed, project, ids, "succeeded")

    # the newest run's stream, again: the same lines, in either mode
    again = run_cli(direct(stack_env), "events", "-p", project, "-o", "ndjson")
    assert again.returncode == 0, again.stderr
    through = api_cli(stack_env, "events", "-p", project, "-o", "ndjson")
    assert through.returncode == 0, through.stderr
    assert again.stdout == through.stdout == applied.stdout
    run_id = streamed[0]["run_id"]
    after = cli("events", "-p", project, "--run", run_id, "--after", "3", "-o", "ndjson")
    assert lines_of(after)[1]["seq"] == 4
    table = cli("events", "-p", project, "--follow")
    assert table.returncode == 0, table.stderr
    assert f"run {run_id} of {project}/default" in table.stdout
    assert "run_complete" in table.stdout and "succeeded (release 1)" in table.stdout
    whole = json.loads(cli("events", "-p", project, "-o", "json").stdout)
    assert whole["stream"]["run_id"] == run_id and len(whole["events"]) == len(streamed) - 1

    # a preview's stream ends with run_complete too
    preview = cli("preview", "-f", str(spec), "-p", project, "-o", "ndjson")
    assert preview.returncode == 0, preview.stderr
    assert lines_of(preview)[-1]["type"] == "run_complete"


@pytest.mark.parametrize("mode", ["direct", "api"])
def test_ndjson_of_a_failing_apply_exits_as_the_run_failed(
    mode: str, tmp_path: Path, stack_env: dict[str, str], api_cli: Cli
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(direct(stack_env), *args) if mode == "direct" else api_cli(stack_env, *args)

    project = new_project()
    (tmp_path / "taken").mkdir()  # a directory where the spec wants a file: Conflict, exit 2
    ok = file_resource(tmp_path / "ok.txt", "ok\n")
    clash = file_resource(tmp_path / "taken", "never\n")
    spec = write_spec(tmp_path / "bad.yaml", [ok, clash])
    failed = cli("apply", "-f", str(spec), "-p", project, "--yes", "-o", "ndjson")
    assert failed.returncode == 2, failed.stdout + failed.stderr
    lines = lines_of(failed)
    check_stream(lines, project, [ok["id"]], "failed")
    [errored] = [e for e in lines[1:] if e["type"] == "apply_errored"]
    assert errored["resource"]["id"] == clash["id"]
    assert "exists as a Directory" in errored["error"]
    assert failed.stderr.startswith("Error: ") and "Traceback" not in failed.stderr

    missing = cli("events", "-p", new_project())
    assert missing.returncode == 1 and "has no runs" in missing.stderr
