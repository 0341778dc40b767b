"""What the side-by-side benchmarks share: a worker of their own, the CLI as a user runs it,
timed peer commands, the server-log check and the result table.

The benchmarks run stackflow exactly as a user does: the ``stackflow`` command (a new
process per operation, ``--yes``) against a worker process (``python worker.py``), both on
a task queue of their own so the ``make up`` worker and other people's runs do not take its
tasks. The worker gets a temporary ``STACKFLOW_HOME`` and a state backend of its own
(SQLite in that home, the default a user gets; or a temporary PostgreSQL database), and its
peak RSS is read from ``/proc/<pid>/status`` (``VmHWM``). With ``profile`` it runs under
py-spy (``PYSPY`` or ``py-spy`` on ``PATH``), sampled into a raw collapsed-stack file.

Nothing here is imported by stackflow; ``make bench`` does not run it (it is not directly
under ``benchmarks/``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("temporal", "postgres", "redis", "kube-apiserver", "etcd", "kube-controller-manager")
"""`make up` services whose CPU the benchmarks report."""
VENV_BIN = REPO / ".venv" / "bin"
STACKFLOW = str(VENV_BIN / "stackflow")
PYTHON = str(VENV_BIN / "python")
HISTORY_WARNINGS = (
    "history size exceeds",
    "history count exceeds",
    "blob size exceeds",
    "payload size exceeds",
    "memo size exceeds",
)


def need_env(*names: str) -> None:
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        raise SystemExit(
            f'{", ".join(missing)} not set: run `eval "$(make -s env)"` (services from `make up`)'
        )


def sizes_arg(values: Sequence[str]) -> list[int]:
    """``--sizes 100 1000`` or ``--sizes 100,1000``."""
    return [int(x.replace("_", "")) for part in values for x in part.split(",") if x]


def tool(env_name: str, name: str) -> str:
    found = os.environ.get(env_name) or shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found: set {env_name} or run `make setup`")
    return found


# ---- state backend ---------------------------------------------------------------------------
@contextlib.contextmanager
def state_url(backend: str, home: Path) -> Iterator[str]:
    """SQLite in the home (what a user gets by default), or a temporary PostgreSQL database
    on ``STACKFLOW_POSTGRES_URL``."""
    if backend == "sqlite":
        yield f"sqlite:///{home / 'state.db'}"
        return
    if backend != "postgresql":
        raise SystemExit(f"unknown backend {backend!r}: sqlite or postgresql")
    import psycopg
    import sqlalchemy as sa

    need_env("STACKFLOW_POSTGRES_URL")
    base = os.environ["STACKFLOW_POSTGRES_URL"]
    name = f"sf_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ---- the worker ------------------------------------------------------------------------------
def _proc_kb(pid: int, key: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else None


class Worker:
    """``python worker.py`` on its own task queue, home and state backend (``processes``: that
    many worker processes under one supervisor, ``--processes``)."""

    def __init__(
        self, env: dict[str, str], log: Path, profile: Path | None = None, processes: int = 1
    ) -> None:
        self.env = {**env, "STACKFLOW_WORKER_PROCESSES": str(processes)}
        self.log = log
        self.profile = profile
        self.processes = processes
        self.proc: subprocess.Popen[bytes] | None = None
        self.spy: subprocess.Popen[bytes] | None = None
        self.peak_kb: dict[int, int] = {}
        self.pids: list[int] = []
        """The processes that run the worker (the supervisor's children, or the one)."""

    def start(self, timeout: float = 90.0) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                # BENCH_WORKER_PREFIX: arguments before ``-m stackflow.worker``, e.g.
                # "-m memray run --aggregate -o worker.bin" for where the peak memory goes
                [
                    PYTHON,
                    *os.environ.get("BENCH_WORKER_PREFIX", "").split(),
                    "-m",
                    "stackflow.worker",
                ],
                env=self.env,
                cwd=code_root(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while self.log.read_text(errors="replace").count("stackflow worker ready") < self.processes:
            if self.proc.poll() is not None:
                raise SystemExit(f"the worker exited during start-up:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the worker did not start in {timeout:g}s:\n{self.tail()}")
            time.sleep(0.2)
        self.pids = [self.proc.pid]
        if self.processes > 1:
            found = re.search(r"stackflow worker: \d+ processes \(pids ([\d, ]+)\)", self.tail(200))
            assert found, self.tail()
            self.pids = [int(p) for p in found.group(1).split(", ")]
        if self.profile is not None:
            spy = os.environ.get("PYSPY") or shutil.which("py-spy")
            if not spy:
                raise SystemExit("--profile needs py-spy: set PYSPY or put py-spy on PATH")
            self.spy = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(self.pids[0]),
                    "--format",
                    "raw",
                    "--rate",
                    "100",
                    "--nonblocking",
                    "-o",
                    str(self.profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_mb(self) -> float | None:
        kb = _proc_kb(self.pid, "VmRSS")
        return None if kb is None else kb / 1024

    def peak_rss_mb(self) -> float | None:
        """Peak resident set size of the worker so far (``VmHWM``; of several processes,
        the sum of each one's peak)."""
        if self.proc and self.proc.poll() is None:
            for pid in self.pids:
                kb = _proc_kb(pid, "VmHWM")
                if kb is not None:
                    self.peak_kb[pid] = max(kb, self.peak_kb.get(pid, 0))
        return sum(self.peak_kb.values()) / 1024 if self.peak_kb else None

    def phase_peak_rss_mb(self) -> float | None:
        """Peak resident set size since the last call (the whole run's peak is kept for
        ``peak_rss_mb``): reads each process's ``VmHWM``, then resets it to the current RSS
        (``clear_refs`` 5), so the next phase's peak is its own."""
        peak = None
        if self.proc and self.proc.poll() is None:
            for pid in self.pids:
                kb = _proc_kb(pid, "VmHWM")
                if kb is None:
                    continue
                self.peak_kb[pid] = max(kb, self.peak_kb.get(pid, 0))
                peak = (peak or 0) + kb / 1024
                with contextlib.suppress(OSError):
                    Path(f"/proc/{pid}/clear_refs").write_text("5")
        return peak

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        self.peak_rss_mb()
        if self.spy is not None and self.spy.poll() is None:
            self.spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.spy.wait(timeout=60)
        terminate(self.proc)


def terminate(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM (a worker drains, the API closes), then SIGKILL after 30 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


API_TOKEN = "bench-admin-token"
"""The bearer token of the benchmarks' own ``stackflow serve`` (approver on every stack)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ApiServer:
    """``stackflow serve`` on the worker's state backend and task queue, with one token."""

    def __init__(self, env: dict[str, str], work: Path) -> None:
        self.env, self.work = env, work
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> None:
        import urllib.request

        tokens = self.work / "tokens.json"
        digest = hashlib.sha256(API_TOKEN.encode()).hexdigest()
        tokens.write_text(
            json.dumps([{"name": "bench", "sha256": digest, "roles": {"*": "approver"}}])
        )
        port = free_port()
        log = self.work / "api.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                # a 50,000-file spec is over the default 8 MB body: a team with such stacks
                # raises it the same way
                [
                    *(PYTHON, "-m", "stackflow.cli.main", "serve", "--port", str(port)),
                    *("--max-body-bytes", str(64 << 20)),
                ],
                # one token for every CLI of a benchmark (12 stacks at once): more streams
                # than a caller's default of 8
                env={
                    "STACKFLOW_API_MAX_STREAMS": "256",
                    **self.env,
                    "STACKFLOW_API_TOKENS": str(tokens),
                },
                cwd=code_root(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/v1/readyz", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"stackflow serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client_env(self) -> dict[str, str]:
        """The CLI's environment in API mode (``STACKFLOW_API_URL``/``_TOKEN``)."""
        return {**self.env, "STACKFLOW_API_URL": self.url, "STACKFLOW_API_TOKEN": API_TOKEN}

    def stop(self) -> None:
        terminate(self.proc)


@dataclass
class Stack:
    """A worker with its environment; ``cli`` runs ``stackflow`` against it (through the
    benchmark's own API server when ``api`` is set: the CLI in API mode)."""

    env: dict[str, str]
    worker: Worker
    work: Path
    queue: str
    backend: str
    api: ApiServer | None = None
    cli_cpu: float = 0.0
    """CPU seconds of the last ``stackflow`` command."""
    meter: CpuMeter | None = None
    """CPU of the worker and the services during the last ``stackflow`` command."""

    def cli(
        self,
        *args: str,
        timeout: float = 3600.0,
        stdin: str | None = None,
        api: bool | None = None,
    ) -> float:
        """Run ``stackflow ARGS``; its wall time in seconds. A failure stops the benchmark.
        ``api``: through the API server or not (default: through it when there is one)."""
        through = self.api is not None if api is None else api
        pids = service_pids(SERVICES)
        if self.api is not None and through:
            pids["stackflow serve"] = self.api.pid
        self.meter = CpuMeter(pids, self.worker.pids)
        self.meter.start()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [STACKFLOW, *args],
            env=self.cli_env() if through else self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
        )
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cli_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        self.meter.stop()
        self.meter.used["stackflow CLI"] = self.cli_cpu
        if done.returncode != 0:
            raise SystemExit(
                f"stackflow {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}\n"
                f"{done.stdout[-2000:]}\nworker log:\n{self.worker.tail()}"
            )
        return seconds

    def cli_env(self) -> dict[str, str]:
        """The ``stackflow`` command's environment: direct, or in API mode."""
        return self.env if self.api is None else self.api.client_env()


class Service:
    """Runs started as a service starts them (a CI system, a platform's backend): one
    Temporal client, connected once, starts each run and waits for its result, so what is
    timed is the run alone, without the ``stackflow`` process's start (Python and the
    Temporal SDK's import, about 0.5 s of every CLI command)."""

    def __init__(self, stack: Stack) -> None:
        import asyncio

        from temporalio.client import Client

        from stackflow.temporal.codec import data_converter

        self.stack = stack
        self.loop = asyncio.new_event_loop()
        self.client = self.loop.run_until_complete(
            Client.connect(
                stack.env["TEMPORAL_ADDRESS"],
                namespace=stack.env.get("TEMPORAL_NAMESPACE", "default"),
                data_converter=data_converter(),
            )
        )

    def run(self, workflow: str, project: str, spec: dict[str, object] | None = None) -> float:
        """Start ``workflow`` (approved up front, as ``--yes``) on the stack's task queue and
        wait for its result; its wall seconds. A run that does not succeed stops the
        benchmark."""
        from stackflow.temporal.operation import OperationInput, OperationResult, workflow_id_for

        request = OperationInput(
            project=project, spec=spec, auto_approve=workflow != "PreviewWorkflow"
        )
        wid = workflow_id_for(request.stack)
        if workflow == "PreviewWorkflow":
            wid += "/preview"
        started = time.perf_counter()
        result = self.loop.run_until_complete(
            self.client.execute_workflow(
                workflow,
                request,
                id=wid,
                task_queue=self.stack.queue,
                result_type=OperationResult,
            )
        )
        seconds = time.perf_counter() - started
        if result.phase != "succeeded":
            raise SystemExit(f"{workflow} {project}: {result.phase}: {result.error}")
        return seconds

    def close(self) -> None:
        self.loop.close()


def code_root() -> Path:
    """Whose code the worker and the CLI run: this checkout, or the tree named by
    ``STACKFLOW_BENCH_CODE`` (e.g. an exported older commit, to compare two versions with
    the same benchmark)."""
    return Path(os.environ.get("STACKFLOW_BENCH_CODE") or REPO).resolve()


def base_env() -> dict[str, str]:
    need_env("TEMPORAL_ADDRESS")
    env = dict(os.environ)
    # the CLI talks to the benchmark's own worker, not through the dev API (`make env`)
    env.pop("STACKFLOW_API_URL", None)
    env.pop("STACKFLOW_API_TOKEN", None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    if code_root() != REPO:
        env["PYTHONPATH"] = str(code_root())  # ahead of the venv's editable install
    env.setdefault("PYTHONUNBUFFERED", "1")
    # an installed stackflow has its bytecode; without it every CLI start compiles its modules
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


@contextlib.contextmanager
def stack(
    backend: str = "sqlite",
    *,
    onprem_root: Path | None = None,
    profile: Path | None = None,
    keep: bool = False,
    extra_env: dict[str, str] | None = None,
    api: bool = False,
    worker_processes: int = 1,
) -> Iterator[Stack]:
    """A worker of the benchmark's own (task queue, home, state backend) and the CLI's
    environment to reach it (``api``: through a ``stackflow serve`` of its own, as a team
    with the service runs the CLI); everything is removed afterwards unless ``keep``."""
    work = Path(tempfile.mkdtemp(prefix="stackflow-bench-"))
    home = work / "home"
    home.mkdir(mode=0o700)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        with state_url(backend, home) as url:
            env = base_env()
            env.update(
                STACKFLOW_TASK_QUEUE=queue,
                STACKFLOW_HOME=str(home),
                STACKFLOW_STATE_URL=url,
            )
            if onprem_root is not None:
                roots = [str(onprem_root)]
                if env.get("STACKFLOW_ONPREM_ROOTS"):
                    roots.append(env["STACKFLOW_ONPREM_ROOTS"])
                env["STACKFLOW_ONPREM_ROOTS"] = os.pathsep.join(roots)
            env.update(extra_env or {})
            worker = Worker(env, work / "worker.log", profile, worker_processes)
            worker.start()
            server = ApiServer(env, work) if api else None
            try:
                if server is not None:
                    server.start()
                yield Stack(env, worker, work, queue, backend, server)
            finally:
                if server is not None:
                    server.stop()
                worker.stop()
    finally:
        if keep:
            print(f"(kept {work})", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


# ---- peers -----------------------------------------------------------------------------------
def timed(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    ok_codes: Sequence[int] = (0,),
    timeout: float = 3600.0,
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run a peer command; (wall seconds, the completed process). Other exit codes stop."""
    started = time.perf_counter()
    done = subprocess.run(
        list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.perf_counter() - started
    if done.returncode not in ok_codes:
        raise SystemExit(
            f"{' '.join(cmd[:4])} … exited {done.returncode}:\n{done.stderr[-3000:]}"
            f"\n{done.stdout[-1000:]}"
        )
    return seconds, done


# ---- CPU time of the processes involved ---------------------------------------------------
def cpu_seconds(pid: int, *, children: bool = False) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (None once it is gone); with
    ``children``, those of its children it has waited for (e.g. the worker's tofu runs)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


def service_pids(names: Sequence[str]) -> dict[str, int]:
    """Pids of the `make up` services named (from their pid files under the run dir)."""
    run_dir = Path(os.environ.get("STACKFLOW_RUN_DIR", REPO / ".run"))
    found = {}
    if os.environ.get("STACKFLOW_BENCH_TEMPORAL_PID"):  # a Temporal server of one's own
        found["temporal"] = int(os.environ["STACKFLOW_BENCH_TEMPORAL_PID"])
    for name in names:
        if name in found:
            continue
        with contextlib.suppress(OSError, ValueError):
            found[name] = int((run_dir / "pids" / f"{name}.pid").read_text().strip())
    return found


class CpuMeter:
    """CPU seconds used by each named process between ``start()`` and ``stop()``; the worker's
    processes (``workers``) count together as ``worker``, their children (tofu) apart."""

    def __init__(self, pids: dict[str, int], workers: Sequence[int] = ()) -> None:
        self.pids = pids
        self.workers = list(workers)
        self.begin: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        found = {n: c for n, p in self.pids.items() if (c := cpu_seconds(p)) is not None}
        for name, children in (("worker", False), ("worker's child processes", True)):
            each = [cpu_seconds(pid, children=children) for pid in self.workers]
            if any(c is not None for c in each):
                found[name] = sum(c for c in each if c is not None)
        return found

    def start(self) -> None:
        self.begin = self._sample()

    def stop(self) -> dict[str, float]:
        for name, now in self._sample().items():
            if name in self.begin and now - self.begin[name] > 0.0:
                self.used[name] = now - self.begin[name]
        return self.used

    def describe(self, wall: float) -> str:
        parts = [f"{n} {s:.1f}" for n, s in sorted(self.used.items(), key=lambda kv: -kv[1])]
        return f"CPU s during {wall:.1f} s wall: " + ", ".join(parts)


# ---- the Temporal server's log ---------------------------------------------------------------
class ServerLog:
    """Lines the dev server logged since construction that warn about history or payload
    sizes (the server logs them at warn level, which `make up` keeps)."""

    def __init__(self) -> None:
        run_dir = Path(os.environ.get("STACKFLOW_RUN_DIR", REPO / ".run"))
        own = os.environ.get("STACKFLOW_BENCH_TEMPORAL_LOG")  # a Temporal server of one's own
        self.path = Path(own) if own else run_dir / "logs" / "temporal.log"
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def warnings(self) -> list[str] | None:
        if not self.path.exists():
            return None
        with self.path.open("rb") as fh:
            fh.seek(self.start)
            new = fh.read().decode(errors="replace")
        return [
            line for line in new.splitlines() if any(w in line.lower() for w in HISTORY_WARNINGS)
        ]

    def report(self) -> str:
        found = self.warnings()
        if found is None:
            return f"server log {self.path} not found: cannot tell about size warnings"
        if not found:
            return f"no history or payload size warning in the Temporal server log ({self.path})"
        shown = "\n".join("  " + line[:300] for line in found[:3])
        return f"the Temporal server logged {len(found)} history/payload size warning(s):\n{shown}"


# ---- output ----------------------------------------------------------------------------------
def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def ratio(ours: float | None, peer: float | None) -> str:
    if not ours or not peer:
        return "-"
    return f"{ours / peer:.1f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float], unit: str = "") -> str:
    """``min-max`` of ``values`` (``-`` for none), as the median/spread tables print it."""
    return f"{min(values):.2f}-{max(values):.2f}{unit}" if values else "-"


@dataclass(frozen=True)
class Sample:
    """One run's row of a side-by-side table: stackflow's wall seconds for ``work`` and the
    peer's for the same work (None: not measured in that run)."""

    work: str
    peer: str
    ours: float | None
    theirs: float | None
    count: int | None = None
    """Objects ``work`` handles (their number per stackflow second is shown), if any."""
    ratio: float | None = None
    """stackflow/peer when it is not ``ours / theirs`` (e.g. per object, when the two
    handle different numbers)."""

    @property
    def ours_per_peer(self) -> float | None:
        if self.ratio is not None:
            return self.ratio
        return self.ours / self.theirs if self.ours and self.theirs else None


def summary(title: str, samples: Sequence[Sample]) -> str:
    """The median and the spread (min-max) over the runs of stackflow's seconds, the peer's
    and their ratio (each run's own ratio), one row per work and peer in the order first
    met; ``title`` above."""
    groups: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.work, sample.peer), []).append(sample)
    with_counts = any(s.count for s in samples)
    rows: list[list[object]] = []
    for (work, peer), runs in groups.items():
        ours = [s.ours for s in runs if s.ours]
        theirs = [s.theirs for s in runs if s.theirs]
        ratios = [r for s in runs if (r := s.ours_per_peer) is not None]
        per_s = [s.count / s.ours for s in runs if s.count and s.ours]
        rows.append(
            [
                work,
                len(runs),
                fmt_s(median(ours)) if ours else "-",
                spread(ours),
                *([f"{median(per_s):.0f}" if per_s else "-"] if with_counts else []),
                peer,
                fmt_s(median(theirs)) if theirs else "-",
                spread(theirs),
                f"{median(ratios):.2f}x" if ratios else "-",
                spread(ratios, "x"),
            ]
        )
    headers = [
        "work",
        "runs",
        "stackflow s",
        "min-max s",
        *(["objects/s"] if with_counts else []),
        "peer",
        "peer s",
        "min-max s",
        "stackflow/peer",
        "min-max",
    ]
    return f"\n== {title}: median and spread (min-max) over the runs\n{table(headers, rows)}"
