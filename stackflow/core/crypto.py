"""Keys and AES-256-GCM encryption for stackflow's payloads (and later, sensitive state).

Keys come from ``STACKFLOW_ENCRYPTION_KEY`` (``<id>:<base64 32 bytes>[,<id>:<key>…]``, the
first is current) or from the file ``STACKFLOW_ENCRYPTION_KEY_FILE`` (YAML/JSON:
``{current: <id>, keys: {<id>: <base64>}}``). Every ciphertext carries the id of the key it
was made with, so keys rotate: add key B, make it current, and data written under key A still
reads while A is kept. A ciphertext under a key this process does not have, or one that does
not authenticate (wrong key, tampered bytes, other associated data), is one clear error,
never garbage.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from stackflow.core.errors import StackflowError

NONCE_BYTES = 12
_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class EncryptionKeyError(StackflowError):
    """A key is missing, malformed, or does not open the data (exit 2: fix the keys)."""

    exit_code = 2


@dataclass(frozen=True)
class KeyRing:
    current: str
    keys: dict[str, bytes]

    @classmethod
    def parse(cls, text: str, source: str) -> KeyRing:
        """``id:base64[,id:base64…]`` (the first is current)."""
        keys: dict[str, bytes] = {}
        current = ""
        for item in [part.strip() for part in text.split(",") if part.strip()]:
            kid, sep, raw = item.partition(":")
            if not sep:
                raise EncryptionKeyError(f"{source}: expected <id>:<base64 key>, got {kid[:8]!r}…")
            keys[kid] = _decode_key(kid, raw, source)
            current = current or kid
        if not keys:
            raise EncryptionKeyError(f"{source}: no key given")
        return cls(current, keys)

    @classmethod
    def load_file(cls, path: Path) -> KeyRing:
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError as err:
            raise EncryptionKeyError(
                f"{path}: cannot read the key file: {err.strerror or err}"
            ) from None
        except yaml.YAMLError:
            raise EncryptionKeyError(f"{path}: the key file is not YAML/JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict):
            raise EncryptionKeyError(
                f"{path}: expected {{current: <id>, keys: {{<id>: <base64>}}}}"
            )
        keys = {str(k): _decode_key(str(k), str(v), str(path)) for k, v in doc["keys"].items()}
        current = str(doc.get("current") or next(iter(keys), ""))
        if current not in keys:
            raise EncryptionKeyError(
                f"{path}: current key {current!r} is not among keys {sorted(keys)}"
            )
        return cls(current, keys)

    @classmethod
    def from_env(cls) -> KeyRing | None:
        """The configured keys, or None when encryption is not configured."""
        text = os.environ.get("STACKFLOW_ENCRYPTION_KEY")
        if text:
            return cls.parse(text, "STACKFLOW_ENCRYPTION_KEY")
        path = os.environ.get("STACKFLOW_ENCRYPTION_KEY_FILE")
        if path:
            return cls.load_file(Path(path).expanduser())
        return None

    def encrypt(self, plaintext: bytes, associated: bytes = b"") -> tuple[str, bytes]:
        """(key id, nonce + ciphertext) under the current key."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        return self.current, nonce + AESGCM(self.keys[self.current]).encrypt(
            nonce, plaintext, associated
        )

    def decrypt(self, kid: str, blob: bytes, associated: bytes = b"", what: str = "data") -> bytes:
        key = self.keys.get(kid)
        if key is None:
            raise EncryptionKeyError(
                f"{what} is encrypted with key {kid!r}, which this process does not have "
                f"(it has {', '.join(sorted(self.keys))}): add that key to "
                "STACKFLOW_ENCRYPTION_KEY or the key file"
            )
        try:
            return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], associated)
        except (InvalidTag, ValueError):
            raise EncryptionKeyError(
                f"{what} does not decrypt with key {kid!r}: a wrong key of that id, or the "
                "data was altered or copied from elsewhere"
            ) from None


def _decode_key(kid: str, raw: str, source: str) -> bytes:
    if not _KEY_ID.match(kid):
        raise EncryptionKeyError(
            f"{source}: key id {kid[:20]!r} must be letters, digits, '.', '_', '-'"
        )
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except ValueError:
        raise EncryptionKeyError(f"{source}: key {kid!r} is not base64") from None
    if len(key) != 32:
        raise EncryptionKeyError(f"{source}: key {kid!r} is {len(key)} bytes; AES-256 needs 32")
    return key


def new_key_line(kid: str) -> str:
    """``<id>:<base64>`` of a fresh random key (``stackflow keys new``)."""
    return f"{kid}:{base64.b64encode(secrets.token_bytes(32)).decode()}"


def write_key_file(path: Path, ring: KeyRing) -> None:
    """Write ``ring`` as a 0600 key file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc = {
        "current": ring.current,
        "keys": {k: base64.b64encode(v).decode() for k, v in ring.keys.items()},
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=2)
