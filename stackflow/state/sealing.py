"""Sensitive values at rest: sealed with the payload keys (:mod:`stackflow.core.crypto`) before
they reach the state backend or Redis, opened when read by a process that has the keys.

A sealed value is ``{"$sealed": {"kid", "rev", "path", "ct"}}`` in place of the value; its
associated data binds it to its row (stack and resource id, which the row gives) and to the
revision and path it was written at (which the envelope gives), so a ciphertext copied to
another resource or stack does not decrypt. Which values are sensitive is what the masking
rules say (Secret data, runtime-private keys such as Terraform state, recorded sensitive
paths, values tainted through references); the list of sensitive paths itself stays clear.
Without keys, values are stored as they are (and masked wherever shown).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

from stackflow.core.crypto import EncryptionKeyError, KeyRing
from stackflow.core.paths import Segment, format_path, matches_prefix, parse_path, pattern_below
from stackflow.core.refs import StackRef
from stackflow.engine.masking import RECORDED_SENSITIVE_KEY, sensitive_paths_for
from stackflow.model.spec import Resource

SEALED = "$sealed"


def _aad(stack: StackRef, resource_id: str, revision: int, path: str) -> bytes:
    return json.dumps([stack.project, stack.workspace, resource_id, revision, path]).encode()


def _apply(
    value: Any,
    at: tuple[Segment, ...],
    patterns: Sequence[Sequence[Segment]],
    seal: Any,
) -> Any:
    for pattern in patterns:
        if matches_prefix(pattern, at):
            return seal(at, value)
    if not any(pattern_below(p, at) is not None for p in patterns):
        return value
    if isinstance(value, Mapping):
        return {k: _apply(v, (*at, k), patterns, seal) for k, v in value.items()}
    if isinstance(value, list):
        return [_apply(v, (*at, i), patterns, seal) for i, v in enumerate(value)]
    return value


class Sealer:
    def __init__(self, keys: KeyRing | None) -> None:
        self.keys = keys

    def seal(self, stack: StackRef, revision: int, resource: Resource) -> str:
        """The resource as the backend stores it (JSON), sensitive values sealed."""
        if self.keys is None:
            return resource.model_dump_json(by_alias=True)
        keys = self.keys
        attributes = resource.attributes
        paths = [
            p
            for p in sensitive_paths_for(str(resource.type), attributes)
            if p != RECORDED_SENSITIVE_KEY
        ]
        if not paths:
            return resource.model_dump_json(by_alias=True)

        def seal(at: tuple[Segment, ...], value: Any) -> Any:
            if value is None or (isinstance(value, Mapping) and SEALED in value):
                return value
            path = format_path(at)
            plain = json.dumps(value, separators=(",", ":")).encode()
            kid, blob = keys.encrypt(plain, _aad(stack, resource.id, revision, path))
            envelope = {"kid": kid, "rev": revision, "path": path}
            return {SEALED: {**envelope, "ct": base64.b64encode(blob).decode()}}

        sealed = _apply(dict(attributes), (), [parse_path(p) for p in paths], seal)
        data = resource.model_dump(mode="json", by_alias=True)
        data["attributes"] = sealed
        return json.dumps(data, separators=(",", ":"))

    def open(self, stack: StackRef, body: str) -> Resource:
        """The resource a stored body stands for, sealed values opened (left sealed without
        keys: they then show as ciphertext, never as the secret)."""
        resource = Resource.model_validate_json(body)
        if self.keys is None or SEALED not in body:
            return resource
        keys = self.keys

        def walk(value: Any) -> Any:
            if isinstance(value, Mapping):
                inner = value.get(SEALED)
                if isinstance(inner, Mapping) and len(value) == 1:
                    aad = _aad(stack, resource.id, inner["rev"], inner["path"])
                    plain = keys.decrypt(
                        inner["kid"],
                        base64.b64decode(inner["ct"]),
                        aad,
                        what=f"sealed value {inner['path']} of {resource.id}",
                    )
                    return json.loads(plain)
                return {k: walk(v) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v) for v in value]
            return value

        return resource.model_copy(update={"attributes": walk(resource.attributes)})

    def keyed(self, digest: str, purpose: str) -> str:
        """``digest`` (of input that may hold sensitive values) as a row may keep it: an HMAC
        under the current key when keys are configured, so whoever reads the rows cannot test
        guesses against it; as it is without keys (the values themselves are then clear)."""
        if self.keys is None:
            return digest
        key = self.keys.keys[self.keys.current]
        return hmac.new(key, f"{purpose}\0{digest}".encode(), hashlib.sha256).hexdigest()

    def seal_text(self, text: str, *context: str) -> str:
        """A whole document (e.g. a Terraform state) sealed for the row ``context`` names."""
        if self.keys is None:
            return text
        kid, blob = self.keys.encrypt(text.encode(), json.dumps(context).encode())
        return json.dumps({SEALED: {"kid": kid, "ct": base64.b64encode(blob).decode()}})

    def open_text(self, stored: str, *context: str) -> str:
        if not stored.startswith('{"' + SEALED):
            return stored
        if self.keys is None:
            raise EncryptionKeyError(
                f"{'/'.join(context)} is sealed and this process has no encryption keys "
                "(STACKFLOW_ENCRYPTION_KEY or STACKFLOW_ENCRYPTION_KEY_FILE)"
            )
        inner = json.loads(stored)[SEALED]
        plain = self.keys.decrypt(
            inner["kid"],
            base64.b64decode(inner["ct"]),
            json.dumps(context).encode(),
            what="/".join(context),
        )
        return plain.decode()
