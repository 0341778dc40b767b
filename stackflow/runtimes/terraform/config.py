"""Kusion-form Terraform resources and the ``main.tf.json`` stackflow writes for each one.

A resource of type ``Terraform`` is written the way Kusion writes it:

- id ``<provider namespace>:<provider name>:<resource type>:<name>``
  (``hashicorp:random:random_password:pw``; the built-in ``terraform_data`` is
  ``builtin:terraform:terraform_data:<name>``),
- ``attributes``: the resource's arguments,
- ``extensions.provider``: ``<host>/<namespace>/<name>/<version>``
  (``registry.terraform.io/hashicorp/random/3.6.0``; ``terraform.io/builtin/terraform`` for the
  built-in provider, which has no version and nothing to install),
- ``extensions.providerMeta``: the provider block's configuration,
- ``extensions.resourceType``: the Terraform resource type,
- ``extensions["kusionstack.io/import-id"]``: import this existing object instead of creating it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stackflow.core.paths import PathError, parse_path
from stackflow.runtimes.base import Attributes, InvalidInput, ResourceRequest
from stackflow.runtimes.terraform.rules import IMPORT_ID_KEY

BUILTIN_SOURCE = "terraform.io/builtin/terraform"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_VERSION = re.compile(r"^v?\d+(\.\d+)*([-+.].*)?$")


@dataclass(frozen=True)
class Provider:
    """A provider requirement: ``source`` (``host/namespace/name``) and exact ``version``."""

    source: str
    version: str | None
    local_name: str

    @property
    def builtin(self) -> bool:
        return self.source == BUILTIN_SOURCE

    @property
    def key(self) -> str:
        """A file-name-safe key for per-provider locks."""
        return re.sub(r"[^A-Za-z0-9._-]", "_", f"{self.source}_{self.version or ''}")


@dataclass(frozen=True)
class TerraformResource:
    """What stackflow needs to drive one resource through the CLI."""

    id: str
    provider: Provider
    provider_meta: Attributes
    resource_type: str
    name: str
    arguments: Attributes
    import_id: str | None
    sensitive: tuple[str, ...] = ()
    """Paths of ``arguments`` holding values taken from sensitive ones: written as sensitive
    variables (:func:`render_variables`), so OpenTofu marks them and what it derives."""

    @property
    def address(self) -> str:
        return f"{self.resource_type}.{self.name}"


def parse_provider(resource_id: str, value: Any) -> Provider:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(
            f"{resource_id}: extensions.provider is required, e.g. "
            "'registry.terraform.io/hashicorp/random/3.6.0' (or "
            f"'{BUILTIN_SOURCE}' for terraform_data)",
            resource_id=resource_id,
        )
    text = value.strip().strip("/")
    if text == BUILTIN_SOURCE:
        return Provider(source=BUILTIN_SOURCE, version=None, local_name="terraform")
    parts = text.split("/")
    version: str | None = None
    if len(parts) >= 3 and _VERSION.match(parts[-1]):
        version = parts[-1].removeprefix("v")
        parts = parts[:-1]
    if len(parts) not in (2, 3) or not all(parts):
        raise InvalidInput(
            f"{resource_id}: extensions.provider {value!r} is not "
            "'[<host>/]<namespace>/<name>/<version>'",
            resource_id=resource_id,
        )
    local_name = parts[-1].removeprefix("terraform-provider-")
    if not _IDENT.match(local_name):
        raise InvalidInput(
            f"{resource_id}: extensions.provider {value!r}: {local_name!r} is not a valid "
            "provider name",
            resource_id=resource_id,
        )
    return Provider(source="/".join(parts), version=version, local_name=local_name)


def _local_name(resource_id: str) -> str:
    """The Terraform resource name: the id's last segment, made a valid identifier."""
    name = resource_id.rsplit(":", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_-]", "_", name) or "this"
    if not _IDENT.match(name):
        name = f"r_{name}"
    return name


def parse_resource(resource: ResourceRequest) -> TerraformResource:
    ext = resource.extensions or {}
    provider = parse_provider(resource.id, ext.get("provider"))
    parts = resource.id.split(":")
    rtype = ext.get("resourceType") or (parts[2] if len(parts) == 4 else None)
    if not isinstance(rtype, str) or not _IDENT.match(rtype):
        raise InvalidInput(
            f"{resource.id}: extensions.resourceType is required (a Terraform resource type "
            "such as 'random_password'), or an id '<namespace>:<provider>:<type>:<name>'",
            resource_id=resource.id,
        )
    meta = ext.get("providerMeta") or {}
    if not isinstance(meta, dict):
        raise InvalidInput(
            f"{resource.id}: extensions.providerMeta must be an object (the provider block)",
            resource_id=resource.id,
        )
    if provider.builtin and meta:
        raise InvalidInput(
            f"{resource.id}: extensions.providerMeta: the built-in terraform provider takes "
            "no configuration",
            resource_id=resource.id,
        )
    import_id = ext.get(IMPORT_ID_KEY)
    if import_id is not None and (not isinstance(import_id, str) or not import_id):
        raise InvalidInput(
            f"{resource.id}: extensions[{IMPORT_ID_KEY!r}] must be a non-empty string",
            resource_id=resource.id,
        )
    return TerraformResource(
        id=resource.id,
        provider=provider,
        provider_meta=dict(meta),
        resource_type=rtype,
        name=_local_name(resource.id),
        arguments=dict(resource.attributes),
        import_id=import_id,
        sensitive=tuple(sorted(set(resource.sensitive_paths))),
    )


def escape_templates(value: Any) -> Any:
    """Strings become literals: ``${`` and ``%{`` would otherwise be Terraform templates.

    Each resource lives alone in its working directory, so an interpolation could never
    refer to anything; a password that happens to contain ``${`` must stay a password. Keys
    too: in JSON syntax an object's property names are templates as well, and a template
    can call ``file()`` on the worker.
    """
    if isinstance(value, str):
        return value.replace("${", "$${").replace("%{", "%%{")
    if isinstance(value, dict):
        return {escape_templates(str(k)): escape_templates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_templates(v) for v in value]
    return value


def required_providers(res: TerraformResource) -> dict[str, Any]:
    if res.provider.builtin:
        return {}
    entry: dict[str, Any] = {"source": res.provider.source}
    if res.provider.version:
        entry["version"] = res.provider.version
    return {res.provider.local_name: entry}


def _variable_name(res: TerraformResource, index: int) -> str:
    """A sensitive variable's name: unique per resource address and path (a batch's
    members share one module)."""
    digest = hashlib.sha256(res.address.encode()).hexdigest()[:12]
    return f"stackflow_sensitive_{digest}_{index}"


def _arguments(res: TerraformResource) -> tuple[Any, dict[str, Any]]:
    """The resource block's arguments (templates escaped), each sensitive value replaced by
    a reference to a variable of its own; and those variables' values."""
    arguments = escape_templates(res.arguments)
    values: dict[str, Any] = {}
    for index, path in enumerate(res.sensitive):
        try:
            segments = parse_path(path)
        except PathError:
            continue
        if not segments:
            continue
        parent: Any = arguments
        plain: Any = res.arguments
        try:
            for seg in segments[:-1]:
                parent, plain = parent[escape_templates(seg)], plain[seg]
            last = segments[-1]
            value = plain[last]
            if not isinstance(parent, dict | list) or value is None:
                continue
            name = _variable_name(res, index)
            parent[escape_templates(last)] = "${var." + name + "}"
        except (KeyError, IndexError, TypeError):
            continue
        values[name] = value
    return arguments, values


def render_variables(members: Sequence[TerraformResource]) -> dict[str, Any]:
    """The values of the members' sensitive variables: the ``*.auto.tfvars.json`` document
    written next to the configuration for the command (its values are literal: ``${`` in a
    password stays ``${``)."""
    values: dict[str, Any] = {}
    for res in members:
        values.update(_arguments(res)[1])
    return values


def render_module(members: Sequence[TerraformResource], *, with_resources: bool) -> dict[str, Any]:
    """The ``main.tf.json`` document (Kusion's layout: terraform, provider, resource) of
    resources sharing one provider configuration (the first's).

    Without the resource blocks, the configuration still names the provider, so refresh and
    destroy can act on the objects the seeded state holds. A value taken from a sensitive
    one (``sensitive``) is given through a ``variable`` with ``sensitive = true`` (its value
    in :func:`render_variables`): OpenTofu then masks it in what it prints and records it in
    the state's ``sensitive_attributes``.
    """
    first = members[0]
    doc: dict[str, Any] = {}
    providers = required_providers(first)
    if providers:
        doc["terraform"] = {"required_providers": providers}
        doc["provider"] = {first.provider.local_name: escape_templates(first.provider_meta)}
    if with_resources:
        blocks: dict[str, dict[str, Any]] = {}
        variables: dict[str, Any] = {}
        for res in members:
            arguments, values = _arguments(res)
            blocks.setdefault(res.resource_type, {})[res.name] = arguments
            variables.update({name: {"sensitive": True} for name in values})
        doc["resource"] = blocks
        if variables:
            doc["variable"] = variables
    return doc


def render_config(
    res: TerraformResource, *, with_resource: bool, import_existing: bool = False
) -> dict[str, Any]:
    """One resource's ``main.tf.json`` (:func:`render_module`), with its import block when
    ``import_existing`` and it names an import id."""
    doc = render_module([res], with_resources=with_resource)
    if with_resource and import_existing and res.import_id:
        doc["import"] = [{"to": res.address, "id": escape_templates(res.import_id)}]
    return doc
