"""Kusion v1 Spec models: a spec's resources ``{id, type, attributes, dependsOn, extensions}``
and their digests. Loading and checking a spec (YAML or JSON, with budgets) is
:mod:`stackflow.engine.spec`'s."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

MAX_RESOURCE_BYTES = 1024 * 1024
"""Serialised attributes of one resource may not exceed this (1 MiB)."""

SET_SECRETS = "_stackflow_set_secrets"
"""A resolved spec's ``context`` key: the sensitive values its ``$stack.`` references took
(from another stack's secret fields). The member's run knows them as its stack's secrets, so
wherever they turn up they are masked and recorded sensitive; release views mask the key."""


class ResourceType(StrEnum):
    """The types of the runtimes stackflow ships (names for callers and tests). A resource's
    ``type`` may name any installed runtime (:mod:`stackflow.model.runtime_rules`)."""

    Kubernetes = "Kubernetes"
    Terraform = "Terraform"
    OnPrem = "OnPrem"


class Resource(BaseModel):
    """One resource of a Spec, with Kusion's field names as aliases."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    id: StrictStr = Field(min_length=1)
    type: str = Field(min_length=1)
    """The runtime's type name; :func:`parse_spec` checks that a runtime declares it."""
    attributes: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[StrictStr] = Field(default_factory=list, alias="dependsOn")
    extensions: dict[str, Any] = Field(default_factory=dict)

    @field_validator("attributes", "extensions", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("depends_on", mode="before")
    @classmethod
    def _null_is_no_deps(cls, value: Any) -> Any:
        return [] if value is None else value


class Spec(BaseModel):
    """A Kusion v1 Spec: resources plus ``secretStore`` and ``context`` passed through."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    resources: list[Resource]
    secret_store: Any = Field(None, alias="secretStore")
    context: dict[str, Any] = Field(default_factory=dict)

    @field_validator("resources", "context", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any, info: Any) -> Any:
        if value is None:
            return [] if info.field_name == "resources" else {}
        return value


def canonical_json(value: Any, *, allow_nan: bool = True) -> bytes:
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
        allow_nan=allow_nan,
    ).encode()


def spec_digest(spec: Spec) -> str:
    """sha256 of the spec's canonical JSON (Kusion field names)."""
    return hashlib.sha256(canonical_json(spec.model_dump(mode="json", by_alias=True))).hexdigest()


def resource_digest(resource: Resource) -> str:
    """sha256 of one resource's canonical JSON (Kusion field names)."""
    data = resource.model_dump(mode="json", by_alias=True)
    return hashlib.sha256(canonical_json(data)).hexdigest()
