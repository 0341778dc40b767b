#!/usr/bin/env python3
"""Standalone, strict JSON schemas for kubeconform, written offline.

kubeconform validates each object against ``<kind>-<group>-<version>.json`` (its
``{{ .ResourceKind }}{{ .KindSuffix }}.json`` naming: ``deployment-apps-v1.json``,
``service-v1.json``, ``scaledobject-keda-v1alpha1.json``) and normally downloads them from
GitHub. This writes them from what is at hand instead:

- built-in kinds from a kube-apiserver's OpenAPI v3 documents (``kubectl get --raw
  /openapi/v3/<group-version>``), every ``$ref`` inlined (standalone) and every object schema
  that lists its properties closed with ``additionalProperties: false`` (strict, as
  kubeconform's ``-strict`` schemas are); ``int-or-string`` becomes ``oneOf: [string,
  integer]`` and ``nullable`` adds ``null`` to the type;
- custom resources from CustomResourceDefinition files (``--crd``), each served version's
  ``openAPIV3Schema`` closed the same way (not where ``x-kubernetes-preserve-unknown-fields``
  keeps a field open).

    scripts/kube_schemas.py --out DIR [--kubectl KUBECTL] [--group-version api/v1 ...]
                            [--crd keda.sh_scaledobjects.yaml ...]

then ``kubeconform -strict -schema-location 'DIR/{{ .ResourceKind }}{{ .KindSuffix }}.json'``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

Schema = dict[str, Any]

DEFAULT_GROUP_VERSIONS = (
    "api/v1",
    "apis/apps/v1",
    "apis/policy/v1",
    "apis/rbac.authorization.k8s.io/v1",
    "apis/autoscaling/v2",
    "apis/networking.k8s.io/v1",
)
"""What the Helm chart renders: Deployments, Services, ServiceAccounts, PDBs, RBAC, HPAs,
NetworkPolicies."""

REF_PREFIX = "#/components/schemas/"


def file_name(api_version: str, kind: str) -> str:
    """kubeconform's ``{{ .ResourceKind }}{{ .KindSuffix }}.json`` for an object."""
    group, _, version = api_version.rpartition("/")
    suffix = f"-{group.split('.')[0].lower()}-{version.lower()}" if group else f"-{version}"
    return f"{kind.lower()}{suffix}.json"


def strict(schema: Any) -> Any:
    """A copy of ``schema`` with every object that lists properties closed, int-or-string and
    nullable spelled in JSON Schema (draft 4, kubeconform's default)."""
    if not isinstance(schema, dict):
        return schema
    if schema.get("format") == "int-or-string" or schema.get("x-kubernetes-int-or-string"):
        return {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    out: Schema = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = strict(value)
        elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
            out[key] = [strict(sub) for sub in value]
        else:
            out[key] = value
    open_ = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in out and "additionalProperties" not in out and not open_:
        out["additionalProperties"] = False
    if out.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def inline(schema: Any, components: dict[str, Schema], seen: tuple[str, ...] = ()) -> Any:
    """``schema`` with every ``$ref`` into ``components`` replaced by its target."""
    if isinstance(schema, list):
        return [inline(item, components, seen) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(REF_PREFIX):
        name = ref[len(REF_PREFIX) :]
        if name in seen:  # a recursive type (JSONSchemaProps): left open past one level
            return {"description": f"{name} (recursive, not checked further)"}
        target = inline(components[name], components, (*seen, name))
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return {**target, **inline(rest, components, seen)} if rest else target
    return {key: inline(value, components, seen) for key, value in schema.items()}


def kinds_of(document: Schema) -> Iterable[tuple[str, str, Schema]]:
    """(apiVersion, kind, standalone strict schema) of each kind an OpenAPI v3 document
    defines with exactly one group-version-kind."""
    components: dict[str, Schema] = document.get("components", {}).get("schemas", {})
    for schema in components.values():
        gvks = schema.get("x-kubernetes-group-version-kind") or []
        if len(gvks) != 1:
            continue
        gvk = gvks[0]
        api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
        full = strict(inline(schema, components))
        props = full.setdefault("properties", {})
        props["apiVersion"] = {"type": "string", "enum": [api_version]}
        props["kind"] = {"type": "string", "enum": [gvk["kind"]]}
        yield api_version, gvk["kind"], full


def crd_kinds(path: Path) -> Iterable[tuple[str, str, Schema]]:
    """(apiVersion, kind, strict schema) of each served version of each CRD in ``path``."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec.get("versions") or []:
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if not version.get("served") or not isinstance(schema, dict):
                continue
            api_version = f"{spec['group']}/{version['name']}"
            full = strict(schema)
            props = full.setdefault("properties", {})
            props["apiVersion"] = {"type": "string", "enum": [api_version]}
            props["kind"] = {"type": "string", "enum": [spec["names"]["kind"]]}
            yield api_version, spec["names"]["kind"], full


def openapi(kubectl: str, group_version: str) -> Schema:
    out = subprocess.run(
        [kubectl, "get", "--raw", f"/openapi/v3/{group_version}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"kubectl get --raw /openapi/v3/{group_version}: {out.stderr.strip()}")
    document: Schema = json.loads(out.stdout)
    return document


def write(out_dir: Path, kinds: Iterable[tuple[str, str, Schema]]) -> list[str]:
    names = []
    for api_version, kind, schema in kinds:
        name = file_name(api_version, kind)
        (out_dir / name).write_text(json.dumps(schema, separators=(",", ":")))
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write into")
    parser.add_argument(
        "--kubectl", default=os.environ.get("STACKFLOW_KUBECTL", "kubectl"), help="kubectl"
    )
    parser.add_argument(
        "--group-version",
        action="append",
        help="OpenAPI v3 path under /openapi/v3 (repeat; default: "
        + " ".join(DEFAULT_GROUP_VERSIONS)
        + ")",
    )
    parser.add_argument("--crd", action="append", type=Path, default=[], help="CRD file")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for gv in args.group_version or DEFAULT_GROUP_VERSIONS:
        written += write(args.out, kinds_of(openapi(args.kubectl, gv)))
    for crd in args.crd:
        written += write(args.out, crd_kinds(crd))
    print(f"{len(written)} schemas in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
