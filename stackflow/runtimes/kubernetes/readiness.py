"""When is a live object ready? Pure checks over the object's spec and status.

Each check returns a :class:`Readiness`: ready, still waiting (with what it waits for), or
failed for good (a Job's Failed condition, a Deployment past its progress deadline).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Readiness:
    ready: bool
    message: str = ""
    failed: bool = False


READY = Readiness(True, "ready")


def _waiting(message: str) -> Readiness:
    return Readiness(False, message)


def _status(obj: Obj) -> Obj:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _spec(obj: Obj) -> Obj:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in _status(obj).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _is_true(cond: Obj | None) -> bool:
    return cond is not None and cond.get("status") == "True"


def _observed(obj: Obj) -> Readiness | None:
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    observed = int(_status(obj).get("observedGeneration") or 0)
    if observed < generation:
        return _waiting(f"controller has not observed generation {generation} yet (at {observed})")
    return None


def _int(mapping: Obj, key: str, default: int = 0) -> int:
    value = mapping.get(key)
    return int(value) if isinstance(value, int | float) else default


def deployment(obj: Obj) -> Readiness:
    status = _status(obj)
    progressing = condition(obj, "Progressing")
    if progressing is not None and progressing.get("reason") == "ProgressDeadlineExceeded":
        return Readiness(False, f"rollout failed: {progressing.get('message', '')}", failed=True)
    waiting = _observed(obj)
    if waiting:
        return waiting
    want = _int(_spec(obj), "replicas", 1)
    updated = _int(status, "updatedReplicas")
    total = _int(status, "replicas")
    available = _int(status, "availableReplicas")
    if updated < want:
        return _waiting(f"{updated} of {want} replicas updated")
    if total > updated:
        return _waiting(f"{total - updated} old replicas pending termination")
    if available < updated:
        return _waiting(f"{available} of {updated} updated replicas available")
    return READY


def stateful_set(obj: Obj) -> Readiness:
    waiting = _observed(obj)
    if waiting:
        return waiting
    spec, status = _spec(obj), _status(obj)
    strategy = spec.get("updateStrategy") or {}
    if strategy.get("type") == "OnDelete":
        return READY
    want = _int(spec, "replicas", 1)
    ready = _int(status, "readyReplicas")
    if ready < want:
        return _waiting(f"{ready} of {want} replicas ready")
    partition = _int((strategy.get("rollingUpdate") or {}), "partition")
    if partition > 0:
        updated = _int(status, "updatedReplicas")
        if updated < want - partition:
            return _waiting(f"{updated} of {want - partition} partitioned replicas updated")
        return READY
    if status.get("updateRevision") != status.get("currentRevision"):
        return _waiting(f"revision {status.get('updateRevision')} not rolled out yet")
    return READY


def daemon_set(obj: Obj) -> Readiness:
    waiting = _observed(obj)
    if waiting:
        return waiting
    status = _status(obj)
    want = _int(status, "desiredNumberScheduled")
    updated = _int(status, "updatedNumberScheduled")
    available = _int(status, "numberAvailable")
    if updated < want:
        return _waiting(f"{updated} of {want} pods updated")
    if available < want:
        return _waiting(f"{available} of {want} pods available")
    return READY


def job(obj: Obj) -> Readiness:
    failed = condition(obj, "Failed")
    if _is_true(failed):
        assert failed is not None
        reason = failed.get("reason") or "Failed"
        message = f"job failed ({reason}): {failed.get('message', '')}".rstrip(": ")
        return Readiness(False, message, failed=True)
    if _is_true(condition(obj, "Complete")):
        return READY
    status = _status(obj)
    return _waiting(f"{_int(status, 'succeeded')} succeeded, {_int(status, 'active')} active")


def persistent_volume_claim(obj: Obj) -> Readiness:
    phase = _status(obj).get("phase")
    return READY if phase == "Bound" else _waiting(f"claim is {phase or 'not bound'}")


def namespace(obj: Obj) -> Readiness:
    phase = _status(obj).get("phase")
    return READY if phase == "Active" else _waiting(f"namespace is {phase or 'not active'}")


def custom_resource_definition(obj: Obj) -> Readiness:
    """Established and NamesAccepted (its kind is then served, once discovery lists it);
    names another CRD holds, or a deletion under way, fail for good."""
    names = condition(obj, "NamesAccepted")
    if names is not None and names.get("status") == "False":
        why = " ".join(str(names.get("message") or names.get("reason") or "").split())
        return Readiness(False, f"its names are not accepted: {why}".rstrip(": "), failed=True)
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return Readiness(False, "it is being deleted", failed=True)
    if not _is_true(names):
        return _waiting("names not accepted yet")
    if not _is_true(condition(obj, "Established")):
        return _waiting("not established yet")
    return READY


def is_crd(api_version: str, kind: str) -> bool:
    return api_version.startswith("apiextensions.k8s.io/") and kind == "CustomResourceDefinition"


def crd_served_kinds(obj: Obj) -> list[tuple[str, str]]:
    """(apiVersion, kind) of every version a CustomResourceDefinition serves."""
    spec = _spec(obj)
    group, kind = spec.get("group"), (spec.get("names") or {}).get("kind")
    if not isinstance(group, str) or not isinstance(kind, str):
        return []
    return [
        (f"{group}/{v['name']}", kind)
        for v in spec.get("versions") or []
        if isinstance(v, Mapping) and v.get("served") and isinstance(v.get("name"), str)
    ]


def generic(obj: Obj) -> Readiness:
    """A ``Ready`` condition if the object has one, else ready as soon as it exists."""
    ready = condition(obj, "Ready")
    if ready is None or _is_true(ready):
        return READY
    why = ready.get("message") or ready.get("reason") or ""
    return _waiting(f"Ready is {ready.get('status')}: {why}".rstrip(": "))


CHECKS: dict[tuple[str, str], Callable[[Obj], Readiness]] = {
    ("apps", "Deployment"): deployment,
    ("apps", "StatefulSet"): stateful_set,
    ("apps", "DaemonSet"): daemon_set,
    ("batch", "Job"): job,
    ("", "PersistentVolumeClaim"): persistent_volume_claim,
    ("", "Namespace"): namespace,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): custom_resource_definition,
}


def readiness(obj: Obj) -> Readiness:
    api_version = str(obj.get("apiVersion") or "")
    group = api_version.rpartition("/")[0]
    check = CHECKS.get((group, str(obj.get("kind") or "")), generic)
    return check(obj)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_timeout(value: Any) -> float | None:
    """``extensions.readinessTimeout``: seconds as a number, or ``"90s"``, ``"5m"``, ``"1h"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("readinessTimeout must be a number of seconds or a duration like '5m'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ValueError(
                f"readinessTimeout {value!r}: use seconds or a duration like '90s', '5m'"
            )
        unit = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
        seconds = float(match.group(1)) * unit
    if seconds <= 0:
        raise ValueError(f"readinessTimeout {value!r} must be positive")
    return seconds
