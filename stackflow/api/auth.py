"""Who calls: ``Authorization: Bearer <token>`` checked against static tokens, stored hashed
in the file ``STACKFLOW_API_TOKENS`` names, and the role each token has per project glob.

The file is YAML or JSON: a list of entries, or ``{"tokens": [...]}``; an entry is
``{"name": "ci", "sha256": "<hex of the token's sha256>", "roles": {"team-*": "operator"}}``.
Roles are ordered: ``viewer`` (read) < ``operator`` (start, retry, abort, cancel) <
``approver`` (approve, reject): each role includes the ones below it. A token's role for a
project is the highest of the globs that match it (shell globs, case-sensitive). Hashes are
compared in constant time, against every entry whatever matched. The entry's ``name`` is
the identity a run records (``operator`` of the run, ``by`` of a decision).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from enum import IntEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stackflow.errors import SpecError

TOKENS_ENV = "STACKFLOW_API_TOKENS"


class Role(IntEnum):
    viewer = 1
    operator = 2
    approver = 3


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    roles: dict[str, Role] = Field(default_factory=dict)

    @field_validator("roles", mode="before")
    @classmethod
    def _role_names(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out: dict[Any, Any] = {}
        for glob, role in value.items():
            if isinstance(role, str):
                if role not in Role.__members__:
                    raise ValueError(f"role {role!r} of {glob!r}: use viewer, operator or approver")
                role = Role[role]
            out[glob] = role
        return out

    def role_for(self, project: str) -> Role | None:
        found = [role for glob, role in self.roles.items() if fnmatchcase(project, glob)]
        return max(found) if found else None


class Identity(BaseModel):
    """An authenticated caller."""

    model_config = ConfigDict(frozen=True)

    name: str
    entry: TokenEntry

    def role_for(self, project: str) -> Role | None:
        return self.entry.role_for(project)

    def allows(self, project: str, needed: Role) -> bool:
        role = self.role_for(project)
        return role is not None and role >= needed


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenTable:
    """The tokens one server accepts."""

    def __init__(self, entries: list[TokenEntry], source: str = "API tokens") -> None:
        names = [e.name for e in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SpecError(f"{source}: the name {dup[0]!r} is given twice")
        self.entries = entries
        self._digests = [bytes.fromhex(e.sha256) for e in entries]

    def authenticate(self, token: str) -> Identity | None:
        """The entry whose hash is the token's, compared with every entry in constant time."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: TokenEntry | None = None
        for entry, known in zip(self.entries, self._digests, strict=True):
            if hmac.compare_digest(digest, known) and found is None:
                found = entry
        return None if found is None else Identity(name=found.name, entry=found)


def parse_tokens(text: str | bytes, source: str = "tokens file") -> TokenTable:
    """A token table from the file's text (YAML or JSON); SpecError naming the entry and field
    of the first mistake."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{source}: invalid YAML{where}") from None
    if isinstance(data, dict) and set(data) == {"tokens"}:
        data = data["tokens"]
    if not isinstance(data, list):
        raise SpecError(f"{source}: a list of tokens (or {{tokens: [...]}}) is expected")
    entries = []
    for i, raw in enumerate(data):
        try:
            entries.append(TokenEntry.model_validate(raw))
        except ValidationError as err:
            first = err.errors(include_url=False)[0]
            field = ".".join(str(p) for p in first["loc"]) or "entry"
            msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
            raise SpecError(f"{source}: token {i + 1}: {field}: {msg}") from None
    return TokenTable(entries, source)


def load_tokens(path: str | None = None) -> TokenTable:
    """The table in the file ``path`` or ``$STACKFLOW_API_TOKENS`` names."""
    path = path or os.environ.get(TOKENS_ENV)
    if not path:
        raise SpecError(
            f"{TOKENS_ENV} is not set: name a file of API tokens (see README, HTTP API); "
            "the API serves no one without it"
        )
    try:
        text = Path(path).read_bytes()
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror or err}") from None
    return parse_tokens(text, path)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None for anything else)."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 4096:
        return None
    return token
