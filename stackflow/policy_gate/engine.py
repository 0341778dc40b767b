"""Evaluating Rego with OPA, the reference engine (built from Go modules in setup).

Why OPA and not an in-process engine: on this kind of machine regopy (rego-cpp) took 1.3 s
for a 1,000-resource plan (a 0.9 MB input) with 8 policies, `opa eval` 0.1 s including its
start (benchmarks/policy_bench.py: 0.43 s for a 6 MB input of 1,000 Deployments and
ConfigMaps, against a 7 s preview of them); OPA is also the engine users' policies
(conftest, HCP Terraform, Spacelift) are written against.

Each module in ``package stackflow`` is one *policy*: it is evaluated in a package of its
own (``stackflow_gate.p<N>``, the package line rewritten in place so error rows stay true),
which is how every message names the policy it came from. Modules in other packages
(``package stackflow.lib``) are libraries the policies import. OPA runs with a
capabilities file that leaves out every built-in that reaches the network or the worker
(``http.send``, ``net.lookup_ip_addr``, ``opa.runtime``…; ``allow_net`` empty), in an empty
environment, under ``--timeout`` and a process timeout: a policy cannot read the worker's
secrets or make it call out, and a slow one fails the run, never passes it.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackflow.errors import SpecError, StackflowError
from stackflow.policy_gate.decision import PolicyMessage, Rule, clean, messages_of

OPA_VAR = "STACKFLOW_OPA_BIN"
TIMEOUT_VAR = "STACKFLOW_POLICY_TIMEOUT"
DEFAULT_TIMEOUT = 10.0
NAMESPACE = "stackflow_gate"
DENIED_BUILTINS = frozenset(
    {
        "http.send",
        "net.lookup_ip_addr",
        "opa.runtime",
        "providers.aws.sign_req",
        "rego.parse_module",
        "trace",
        "print",
    }
)
_PACKAGE = re.compile(r"^package[ \t]+stackflow[ \t]*(?=#|$)", re.M)
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


def _env(home: str) -> dict[str, str]:
    return {"PATH": os.defpath, "HOME": home}


def _rewrite(modules: Sequence[Module]) -> tuple[dict[str, str], dict[str, str]]:
    """File name -> source for OPA, and file name -> policy name (policies are ``p<N>``
    in ``stackflow_gate``; libraries keep their package)."""
    files: dict[str, str] = {}
    names: dict[str, str] = {}
    for index, module in enumerate(modules):
        file = f"m{index}.rego"
        match = _PACKAGE.search(module.source)
        source = module.source
        if match is not None:
            source = f"{source[: match.start()]}package {NAMESPACE}.p{index}{source[match.end() :]}"
        files[file] = source
        names[file] = module.policy
    return files, names


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
    """Every message of every policy for the input document ``input_body`` (JSON), and the
    policies' names. PolicyError when a module does not compile or time runs out."""
    limit = timeout_seconds() if timeout is None else timeout
    opa = find_opa()
    caps = capabilities_file(opa)
    files, names = _rewrite(modules)
    policies = [names[f"m{i}.rego"] for i, m in enumerate(modules) if _PACKAGE.search(m.source)]
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
                cmd, capture_output=True, timeout=limit + 10, env=_env(work), check=False
            )
        except subprocess.TimeoutExpired:
            raise PolicyError(
                f"policies did not finish within {limit:g}s ({TIMEOUT_VAR})"
            ) from None
    try:
        out = json.loads(proc.stdout or b"{}")
    except ValueError:
        out = {}
    if proc.returncode != 0 or out.get("errors"):
        if not out.get("errors"):
            raise PolicyError(f"opa eval failed: {clean(proc.stderr.decode(errors='replace'))}")
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
