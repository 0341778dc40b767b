"""Evaluating Rego with OPA, the reference engine (built from Go modules in setup).

Why OPA and not an in-process engine: on this kind of machine regopy (rego-cpp) took 1.3 s
for a 1,000-resource plan (a 0.9 MB input) with 8 policies, `opa eval` 0.1 s including its
start (benchmarks/policy_bench.py: 0.43 s for a 6 MB input of 1,000 Deployments and
ConfigMaps, against a 7 s preview of them); OPA is also the engine users' policies
(conftest, HCP Terraform, Spacelift) are written against.

Each bundle (the project's, the run's own) is evaluated by an OPA process of its own
(:func:`evaluate_apart`): a run's modules never share a package, a rule or a library with
the project's, so a run can add denials but never change or remove one of the project's.
Within a bundle each module in ``package stackflow`` is one *policy*: it is evaluated in a
package of its own (``stackflow_gate.p<N>``, the package reference rewritten in place so
error rows stay true), which is how every message names the policy it came from. Modules in
other packages (``package stackflow.lib``) are libraries the bundle's policies import; a
module that is neither, that declares ``stackflow_gate``, or whose METADATA declares
``schemas`` (the compiler would load their ``$ref``: a worker file) is refused
(:func:`stackflow.policy_gate.rego.layout`). OPA runs with a capabilities file that leaves
out every built-in that reaches the network, the worker or its files (``http.send``,
``net.lookup_ip_addr``, ``opa.runtime``, ``json.match_schema`` and ``json.verify_schema``,
which follow ``file://`` schema references…; ``allow_net`` empty), in an empty environment,
under ``--timeout``, a process timeout and a memory limit (``STACKFLOW_POLICY_MEMORY_MB``,
see :func:`limited`): a policy cannot read the worker's secrets or make it call out, and a
slow or hungry one fails the run, never passes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackflow.core.errors import SpecError, StackflowError
from stackflow.model.policy import PolicyMessage, Rule, clean, messages_of
from stackflow.policy_gate.rego import RegoLayoutError, layout

OPA_VAR = "STACKFLOW_OPA_BIN"
TIMEOUT_VAR = "STACKFLOW_POLICY_TIMEOUT"
DEFAULT_TIMEOUT = 10.0
MEMORY_VAR = "STACKFLOW_POLICY_MEMORY_MB"
DEFAULT_MEMORY_MB = 1024
MIN_MEMORY_MB = 128
NAMESPACE = "stackflow_gate"
DENIED_BUILTINS = frozenset(
    {
        "http.send",
        "json.match_schema",  # a schema's $ref may name file:// (a worker file)
        "json.verify_schema",
        "net.lookup_ip_addr",
        "opa.runtime",
        "providers.aws.sign_req",
        "rego.parse_module",
        "trace",
        "print",
    }
)
GO_CRASH = 2
"""The exit status of a Go program its runtime stopped."""
_GO_CRASH = re.compile(r"(fatal error: |runtime: |SIGSEGV|SIGBUS|unexpected signal)")
"""How the runtime says so. At the memory limit it says ``fatal error: runtime: out of
memory`` or ``… cannot allocate memory``, or (Go 1.26's collector, about one time in five
on this machine) crashes with ``SIGSEGV: segmentation violation``; a policy has no other way
to crash OPA's runtime, so each is the limit met."""
_SHELL = "/bin/sh"
_LIMITED = 'ulimit -d "$1" || exit 125; shift; exec "$@"'
_HOW_TO_FIX = "run `make setup` on this worker (it builds OPA) or set STACKFLOW_OPA_BIN"


class PolicyError(SpecError):
    """The policies cannot be evaluated: a module does not compile, evaluation took too
    long, or the input is refused. The run fails (exit 2) saying so: never a silent pass."""


class PolicyEngineMissing(StackflowError):
    """This worker has no OPA binary (a worker's setup problem)."""


@dataclass(frozen=True)
class Module:
    policy: str
    """The name messages carry: ``<scope>/<path in the bundle>``."""
    source: str


def find_opa() -> str:
    """``$STACKFLOW_OPA_BIN``, else the one setup built, else ``opa`` on PATH."""
    configured = os.environ.get(OPA_VAR)
    if configured:
        if os.access(configured, os.X_OK):
            return configured
        raise PolicyEngineMissing(f"{OPA_VAR}={configured} is not an executable: {_HOW_TO_FIX}")
    cache = Path(os.environ.get("STACKFLOW_CACHE") or Path.home() / ".cache" / "stackflow")
    built = sorted(cache.glob("tools/opa-*/bin/opa"))
    if built:
        return str(built[-1])
    found = shutil.which("opa")
    if found:
        return found
    raise PolicyEngineMissing(f"no OPA binary for the policy gate: {_HOW_TO_FIX}")


def timeout_seconds() -> float:
    raw = os.environ.get(TIMEOUT_VAR, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        raise PolicyEngineMissing(f"{TIMEOUT_VAR}={raw!r} is not a number of seconds") from None
    return max(0.1, value)


_caps_lock = threading.Lock()
_caps: dict[tuple[str, int], str] = {}
_caps_dir = tempfile.mkdtemp(prefix="stackflow-opa-")


def capabilities_file(opa: str) -> str:
    """OPA's own capabilities less :data:`DENIED_BUILTINS` and any network (one file per
    binary, written once per process)."""
    key = (opa, os.stat(opa).st_mtime_ns)
    with _caps_lock:
        if key in _caps:
            return _caps[key]
    out = subprocess.run(
        [opa, "capabilities", "--current"],
        capture_output=True,
        timeout=30,
        env=_env(_caps_dir),
        check=False,
    )
    if out.returncode != 0:
        raise PolicyEngineMissing(
            f"{opa} capabilities: {clean(out.stderr.decode(errors='replace'))}"
        )
    caps = json.loads(out.stdout)
    caps["builtins"] = [b for b in caps.get("builtins", []) if b.get("name") not in DENIED_BUILTINS]
    caps["allow_net"] = []
    path = os.path.join(_caps_dir, f"capabilities-{len(_caps)}.json")
    with open(path, "w") as handle:
        json.dump(caps, handle)
    with _caps_lock:
        _caps[key] = path
    return path


def memory_mb() -> int:
    """The memory OPA may map, in MiB (``$STACKFLOW_POLICY_MEMORY_MB``)."""
    raw = os.environ.get(MEMORY_VAR, "")
    try:
        value = int(raw) if raw else DEFAULT_MEMORY_MB
    except ValueError:
        raise PolicyEngineMissing(f"{MEMORY_VAR}={raw!r} is not a number of MiB") from None
    if value < MIN_MEMORY_MB:
        raise PolicyEngineMissing(
            f"{MEMORY_VAR}={raw}: at least {MIN_MEMORY_MB} (MiB; the default is "
            f"{DEFAULT_MEMORY_MB})"
        )
    return value


def _env(home: str, memory: int | None = None) -> dict[str, str]:
    env = {"PATH": os.defpath, "HOME": home}
    if memory is not None:  # the collector works harder before the hard limit is met
        env["GOMEMLIMIT"] = f"{memory * 3 // 4}MiB"
    return env


def limited(cmd: list[str], memory: int) -> list[str]:
    """``cmd`` started by ``/bin/sh`` after ``ulimit -d`` (RLIMIT_DATA, in KiB), the shell
    then replaced by ``cmd``: the limit is set in the child, nothing runs in the worker
    between fork and exec (a ``preexec_fn`` would, in a threaded process). RLIMIT_DATA
    (Linux ≥ 4.7: every private writable mapping, where Go keeps its heap) and not
    RLIMIT_AS: Go reserves address space it never uses, so that under ``ulimit -v`` the
    same evaluation passed at 1,000,000 KiB and failed at 1,300,000 (6 runs of each),
    where under ``ulimit -d`` it needs 100-150 MiB every time. GOMEMLIMIT (soft) is set
    below it so the collector works harder before the hard limit is met."""
    return [_SHELL, "-c", _LIMITED, "stackflow-opa", str(memory * 1024), *cmd]


def _rewrite(modules: Sequence[Module]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """File name -> source for OPA, file name -> policy name (policies are ``p<N>`` in
    ``stackflow_gate``; libraries keep their package) and the policies' names.
    PolicyError when a module cannot be judged as written (see :func:`layout`)."""
    try:
        heads = layout({m.policy: m.source for m in modules})
    except RegoLayoutError as exc:
        raise PolicyError(f"policy {exc}") from None
    files: dict[str, str] = {}
    names: dict[str, str] = {}
    policies: list[str] = []
    for index, module in enumerate(modules):
        file = f"m{index}.rego"
        found = heads[module.policy]
        source = module.source
        if found.is_policy:
            start, end = found.span
            lines = "\n" * source.count("\n", start, end)  # rows stay true
            source = f"{source[:start]}{NAMESPACE}.p{index}{lines}{source[end:]}"
            policies.append(module.policy)
        files[file] = source
        names[file] = module.policy
    return files, names, policies


def _error_line(out: dict[str, Any], names: dict[str, str], timeout: float, bundle: str) -> str:
    """One line for OPA's errors: the first (module named as the bundle names it, never by
    the worker's temporary path) and how many more."""
    errors = out.get("errors") or []
    first = errors[0] if errors else {}
    code = str(first.get("code", ""))
    if code == "eval_cancel_error" or "deadline" in str(first.get("message", "")):
        return f"policies did not finish within {timeout:g}s ({TIMEOUT_VAR})"
    where = first.get("location") or {}
    file = os.path.basename(str(where.get("file", "")))
    at = f"{names.get(file, file)}:{where.get('row', '?')}: " if file else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    message = str(first.get("message", "failed"))
    for name, policy in names.items():
        message = message.replace(os.path.join(bundle, name), policy)
    return f"policy {at}{code}: {clean(message)}{more}".replace("policy : ", "policy ")


def evaluate(
    modules: Sequence[Module], input_body: bytes, timeout: float | None = None
) -> tuple[list[PolicyMessage], list[str]]:
    """Every message of every policy of one bundle's ``modules`` for the input document
    ``input_body`` (JSON), and the policies' names, from one OPA process. PolicyError when
    a module cannot be judged or does not compile, or time or memory runs out."""
    limit = timeout_seconds() if timeout is None else timeout
    memory = memory_mb()
    opa = find_opa()
    caps = capabilities_file(opa)
    files, names, policies = _rewrite(modules)
    with tempfile.TemporaryDirectory(prefix="stackflow-policy-") as work:
        bundle = os.path.join(work, "bundle")
        os.mkdir(bundle)
        for file, source in files.items():
            with open(os.path.join(bundle, file), "w") as handle:
                handle.write(source)
        input_path = os.path.join(work, "input.json")
        with open(input_path, "wb") as handle:
            handle.write(input_body)
        cmd = [
            opa, "eval", "--format", "json", "--capabilities", caps,
            "--timeout", f"{limit:g}s", "--data", bundle, "--input", input_path,
            f"data.{NAMESPACE}",
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                limited(cmd, memory),
                capture_output=True,
                timeout=limit + 10,
                env=_env(work, memory),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise PolicyError(
                f"policies did not finish within {limit:g}s ({TIMEOUT_VAR})"
            ) from None
        except OSError as exc:
            raise PolicyEngineMissing(f"cannot start {_SHELL} for OPA: {exc}") from None
    try:
        out = json.loads(proc.stdout or b"{}")
    except ValueError:
        out = {}
    if proc.returncode != 0 or out.get("errors"):
        if not out.get("errors"):
            stderr = proc.stderr.decode(errors="replace")
            first = clean(stderr.strip().split("\n", 1)[0])
            if proc.returncode == GO_CRASH and _GO_CRASH.match(first):
                raise PolicyError(
                    f"policies stopped OPA at its memory limit of {memory} MiB ({MEMORY_VAR}: "
                    f"raise it, or make the policies take less): {first}; nothing was judged"
                )
            raise PolicyError(f"opa eval failed: {clean(stderr)}")
        raise PolicyError(_error_line(out, names, limit, bundle))
    value: dict[str, Any] = {}
    for result in out.get("result") or []:
        for expression in result.get("expressions") or []:
            if isinstance(expression.get("value"), dict):
                value = expression["value"]
    messages: list[PolicyMessage] = []
    for index, module in enumerate(modules):
        rules = value.get(f"p{index}")
        if not isinstance(rules, dict):
            continue
        for rule in Rule:
            messages.extend(messages_of(module.policy, rule, rules.get(rule.value)))
    return messages, policies


def evaluate_apart(
    bundles: Sequence[Sequence[Module]], input_body: bytes, timeout: float | None = None
) -> tuple[list[PolicyMessage], list[str]]:
    """Each bundle's modules (the project's, the run's own) in an OPA process of its own,
    side by side, none seeing another's packages: every message of all of them (each
    naming its policy and resource: any deny denies) and every policy's name. The first
    bundle that cannot be evaluated fails it all (PolicyError): never a partial pass."""
    groups = [list(modules) for modules in bundles if modules]
    if len(groups) <= 1:
        return evaluate(groups[0], input_body, timeout) if groups else ([], [])
    with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="opa") as pool:
        results = list(pool.map(lambda group: evaluate(group, input_body, timeout), groups))
    messages = [m for found, _ in results for m in found]
    policies = [p for _, names in results for p in names]
    return messages, policies
