"""The web UI's run page for a run of 1,000 resources waiting for approval (the page an
approver opens), beside its peer in the same run: the API's JSON view of that run
(``GET /v1/stacks/{p}/{w}/runs/{run_id}``), and its preview (``…/preview``), whose data the
page renders. The page reads the run's status and its preview and renders one page of the
field diff (50 resources); each is timed from the client (HTTP on loopback, one
``stackflow serve`` process and one worker of this checkout).

Prints p50/p95 of each and the ratio page / JSON view (target: page p95 ≤ 100 ms).

    eval "$(make -s env)"
    .venv/bin/python benchmarks/ui_bench.py                    # 1,000 files, 100 requests
    .venv/bin/python benchmarks/ui_bench.py --files 200 --requests 50
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from benchmarks._lib import harness  # noqa: E402
from benchmarks.api_bench import pct, spec_for  # noqa: E402

TOKEN = harness.API_TOKEN


def timings(http: httpx.Client, path: str, requests: int) -> list[float]:
    took = []
    for _ in range(requests):
        began = time.perf_counter()
        r = http.get(path)
        took.append(time.perf_counter() - began)
        if r.status_code != 200:
            raise SystemExit(f"{path}: {r.status_code} {r.text[:300]}")
    return took


def waiting_run(http: httpx.Client, stack: str, root: Path, files: int) -> str:
    """An apply of ``files`` files started through the API, once it waits for approval."""
    body = {"operation": "apply", "spec": spec_for(root, files)}
    r = http.post(
        f"/v1/stacks/{stack}/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    if r.status_code != 201:
        raise SystemExit(f"start: {r.status_code} {r.text}")
    url = str(r.json()["status_url"])
    deadline = time.monotonic() + 600
    while True:
        view = http.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).json()
        if view.get("phase") == "awaitingApproval":
            return str(view["run_id"])
        if view["status"] != "running" or time.monotonic() > deadline:
            raise SystemExit(f"the run did not wait for approval: {view}")
        time.sleep(1)


def signed_in(url: str) -> httpx.Client:
    """A client signed in to the UI with the benchmark's token (its session cookie)."""
    ui = httpx.Client(base_url=url, timeout=60, follow_redirects=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', ui.get("/ui/login").text)
    assert csrf is not None
    done = ui.post("/ui/login", data={"csrf": csrf.group(1), "token": TOKEN})
    if "Signed in as" not in done.text:
        raise SystemExit(f"sign-in failed: {done.status_code} {done.text[:300]}")
    return ui


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stackflow-ui-bench-"))
    stack = f"bui{uuid.uuid4().hex[:6]}/default"
    with harness.stack(args.backend, onprem_root=root, api=True) as running:
        assert running.api is not None
        url = running.api.url
        api = httpx.Client(base_url=url, timeout=60)
        run_id = waiting_run(api, stack, root, args.files)
        api.headers["Authorization"] = f"Bearer {TOKEN}"
        ui = signed_in(url)
        page = f"/ui/s/{stack}/runs/{run_id}"
        view = f"/v1/stacks/{stack}/runs/{run_id}"
        text = ui.get(page).text
        if "awaitingApproval" not in text or "Page 1 of" not in text:
            raise SystemExit("the run page does not show the waiting run's paginated diff")
        timings(ui, page, 5), timings(api, view, 5)  # warm both
        measured = {
            "run page (HTML, diff page 1)": timings(ui, page, args.requests),
            "run page (HTML, diff page 10)": timings(ui, page + "?page=10", args.requests),
            "run view (JSON API)": timings(api, view, args.requests),
            "preview (JSON API)": timings(api, view + "/preview", args.requests),
        }
        size = len(ui.get(page).content)
        api.post(view + "/reject")
    rows = [
        [name, f"{pct(took, 0.5) * 1000:.1f}", f"{pct(took, 0.95) * 1000:.1f}"]
        for name, took in measured.items()
    ]
    html, json_view = measured["run page (HTML, diff page 1)"], measured["run view (JSON API)"]
    rows.append(
        [
            "ratio page / JSON view",
            harness.ratio(pct(html, 0.5), pct(json_view, 0.5)),
            harness.ratio(pct(html, 0.95), pct(json_view, 0.95)),
        ]
    )
    print(
        f"a run of {args.files} resources awaiting approval, {args.requests} requests each, "
        f"one at a time ({args.backend}); the page is {size // 1024} KiB"
    )
    print(harness.table(["", "p50 ms", "p95 ms"], rows))
    p95_ms = pct(html, 0.95) * 1000
    print(f"run page p95: {p95_ms:.1f} ms (target <= 100 ms)")


if __name__ == "__main__":
    main()
