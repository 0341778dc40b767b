#!/usr/bin/env bash
# `make docs`: build the docs site (mkdocs.yml, docs/) into site/ with `mkdocs build --strict`.
# mkdocs and its theme come from the `docs` dependency group of uv.lock; `uv run --group docs`
# adds them to the project's venv (.venv) at the locked versions, leaving everything else as
# `make setup` put it. The reference pages are generated from the code at build time
# (scripts/docs_reference.py); no running service is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check "uv==0.13.8" 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
# Material for MkDocs 9.7+ prints a banner on every build (its end of life in May 2027, and its
# successor Zensical, which reads this mkdocs.yml) unless this is set.
export NO_MKDOCS_2_WARNING=1
exec uv run --frozen --quiet --group docs mkdocs build --strict "$@"
