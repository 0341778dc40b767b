"""Who calls: ``Authorization: Bearer <token>`` checked against static tokens, stored hashed
in the file ``STACKFLOW_API_TOKENS`` names, and the role each token has per project glob;
or, when that file has an ``oidc:`` section, an OIDC JWT (:mod:`stackflow.api.oidc`).

The file is YAML or JSON: a list of entries, or ``{"tokens": [...], "oidc": {...}}`` (both
keys optional); an entry is
``{"name": "ci", "sha256": "<hex of the token's sha256>", "roles": {"team-*": "operator"}}``.
Roles are ordered: ``viewer`` (read) < ``operator`` (start, retry, abort, cancel) <
``approver`` (approve, reject): each role includes the ones below it. A caller's role for a
project is the highest of the globs that match it (shell globs, case-sensitive). Hashes are
compared in constant time, against every entry whatever matched. The entry's ``name`` (or
the JWT's identity claim) is the identity a run records (``operator`` of the run, ``by`` of
a decision).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from stackflow.api.identity import Identity, Role, best_role, role_map
from stackflow.core.errors import SpecError

if TYPE_CHECKING:
    from stackflow.api.oidc import OidcVerifier

TOKENS_ENV = "STACKFLOW_API_TOKENS"


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    roles: dict[str, Role] = Field(default_factory=dict)

    @field_validator("roles", mode="before")
    @classmethod
    def _role_names(cls, value: Any) -> Any:
        return role_map(value)

    def role_for(self, project: str) -> Role | None:
        return best_role(self.roles, project)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def looks_like_jwt(token: str) -> bool:
    """Two dots and a header that decodes as a JWT's (the signature is not looked at)."""
    if token.count(".") != 2:
        return False
    import jwt  # only a server with OIDC asks: the CLI's in-process API never imports it

    try:
        jwt.get_unverified_header(token)
    except (jwt.PyJWTError, ValueError):  # ValueError: not UTF-8
        return False
    return True


class TokenTable:
    """The credentials one server accepts: static tokens, and OIDC JWTs when ``oidc`` is set
    (a bearer value that :func:`looks_like_jwt` goes to it, any other to the static table)."""

    def __init__(
        self,
        entries: list[TokenEntry],
        source: str = "API tokens",
        oidc: OidcVerifier | None = None,
    ) -> None:
        names = [e.name for e in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SpecError(f"{source}: the name {dup[0]!r} is given twice")
        self.entries = entries
        self.oidc = oidc
        self._digests = [bytes.fromhex(e.sha256) for e in entries]

    def authenticate(self, token: str) -> Identity | None:
        """The caller ``token`` proves, None for an invalid one; AuthUnavailable when the
        OIDC issuer's keys cannot be fetched. May block (a JWKS fetch): async code calls
        :meth:`authenticate_async`."""
        if self.oidc is not None and looks_like_jwt(token):
            return self.oidc.authenticate(token)
        return self.static(token)

    async def authenticate_async(self, token: str) -> Identity | None:
        """:meth:`authenticate`, a JWT verified on a worker thread (its keys may be fetched)."""
        if self.oidc is not None and looks_like_jwt(token):
            return await run_in_threadpool(self.oidc.authenticate, token)
        return self.static(token)

    def static(self, token: str) -> Identity | None:
        """The entry whose hash is the token's, compared with every entry in constant time."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: TokenEntry | None = None
        for entry, known in zip(self.entries, self._digests, strict=True):
            if hmac.compare_digest(digest, known) and found is None:
                found = entry
        return None if found is None else Identity(name=found.name, roles=dict(found.roles))


def _first_error(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    field = ".".join(str(p) for p in first["loc"]) or "entry"
    msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
    return f"{field}: {msg}"


def parse_tokens(text: str | bytes, source: str = "tokens file") -> TokenTable:
    """A token table from the file's text (YAML or JSON); SpecError naming the entry and field
    of the first mistake."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{source}: invalid YAML{where}") from None
    oidc: OidcVerifier | None = None
    if isinstance(data, dict) and {"tokens", "oidc"} & set(data):
        unknown = sorted(str(k) for k in data if k not in ("tokens", "oidc"))
        if unknown:
            raise SpecError(f"{source}: {unknown[0]}: unknown field (use tokens and oidc)")
        if data.get("oidc") is not None:
            from stackflow.api.oidc import OidcConfig, OidcVerifier

            try:
                config = OidcConfig.model_validate(data["oidc"])
            except ValidationError as err:
                raise SpecError(f"{source}: oidc: {_first_error(err)}") from None
            oidc = OidcVerifier(config)
        data = data.get("tokens")
        data = [] if data is None else data
    if not isinstance(data, list):
        raise SpecError(f"{source}: a list of tokens (or {{tokens: [...]}}) is expected")
    entries = []
    for i, raw in enumerate(data):
        try:
            entries.append(TokenEntry.model_validate(raw))
        except ValidationError as err:
            raise SpecError(f"{source}: token {i + 1}: {_first_error(err)}") from None
    return TokenTable(entries, source, oidc)


def load_tokens(path: str | None = None) -> TokenTable:
    """The table in the file ``path`` or ``$STACKFLOW_API_TOKENS`` names."""
    path = path or os.environ.get(TOKENS_ENV)
    if not path:
        raise SpecError(
            f"{TOKENS_ENV} is not set: name a file of API tokens (see docs/guide/http-api.md); "
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
