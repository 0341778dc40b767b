"""OIDC JWTs as API credentials: the ``oidc:`` section of the tokens file
(:func:`stackflow.api.auth.parse_tokens`) names the issuer, the audience and the issuer's JWKS
URL; a JWT is accepted when its signature verifies with one of those keys (an asymmetric
algorithm of ``algorithms``: never ``none`` or HS*), ``exp`` is in the future, ``nbf`` and
``iat`` not (each with ``leeway_seconds``), ``iss`` and ``aud`` are the configured ones.

The caller is the ``identity_claim`` (``sub`` by default; at most 200 characters, no control
characters) and its roles are those ``roles`` gives each value of ``roles_claim`` (a string or
a list of strings): per project, the highest role of any matching glob of any of them.

The keys are fetched when first needed, kept :data:`JWKS_LIFESPAN` seconds, and fetched again
early for a key id they lack (a rotation) at most every :data:`JWKS_MIN_REFRESH` seconds.
Keys that cannot be fetched make the request :class:`AuthUnavailable` (503), for
:data:`JWKS_RETRY_AFTER` seconds without trying again, so a down issuer does not queue every
request behind a timeout.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import unicodedata
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt
from pydantic import BaseModel, ConfigDict, Field, field_validator

from stackflow.api.identity import AuthUnavailable, Identity, Role, role_map
from stackflow.core.loopback import is_loopback

log = logging.getLogger("stackflow.api")

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""Asymmetric only: a JWT signed with a shared secret (HS*) or none is never accepted."""
JWKS_TIMEOUT = 5.0
JWKS_LIFESPAN = 300.0
JWKS_MIN_REFRESH = 30.0
JWKS_RETRY_AFTER = 5.0
JWKS_MAX_BYTES = 1024 * 1024
NAME_MAX = 200
_REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


class OidcConfig(BaseModel):
    """The ``oidc:`` section of the tokens file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    jwks_url: str
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"], min_length=1)
    identity_claim: str = Field(default="sub", min_length=1)
    roles_claim: str = Field(default="groups", min_length=1)
    roles: dict[str, dict[str, Role]] = Field(default_factory=dict)
    leeway_seconds: int = Field(default=30, ge=0, le=300)
    authorization_url: str | None = None
    """The issuer's authorization endpoint: the web UI (``/ui``) signs people in there with
    the authorization-code flow and PKCE (without it and ``token_url``, by static token only)."""
    token_url: str | None = None
    """The issuer's token endpoint: the UI trades the code for an access token there, verified
    as an API credential is."""
    client_id: str | None = None
    """The UI's (public) client id at the issuer; the ``audience`` when not given."""

    @field_validator("jwks_url", "authorization_url", "token_url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme == "https" and parts.hostname:
            return value
        if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
            return value
        raise ValueError("an https:// URL (http:// only on loopback)")

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in ALGORITHMS:
                raise ValueError(f"{name!r}: use {', '.join(ALGORITHMS)} (never none or HS*)")
        return value

    @field_validator("roles", mode="before")
    @classmethod
    def _role_names(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {group: role_map(globs, f"{group}: ") for group, globs in value.items()}


@dataclass(frozen=True)
class Key:
    kid: str | None
    jwk: jwt.PyJWK
    alg: str | None
    """The ``alg`` the JWKS declares for the key, if it does."""


class Jwks:
    """The issuer's signing keys, fetched from ``url`` and cached (thread-safe: one fetch at
    a time, the others wait for it)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = JWKS_TIMEOUT,
        lifespan: float = JWKS_LIFESPAN,
        min_refresh: float = JWKS_MIN_REFRESH,
        retry_after: float = JWKS_RETRY_AFTER,
    ) -> None:
        self.url = url
        self.timeout, self.lifespan = timeout, lifespan
        self.min_refresh, self.retry_after = min_refresh, retry_after
        self._lock = threading.Lock()
        self._keys: list[Key] | None = None
        self._fetched = 0.0
        self._failed: tuple[float, str] | None = None

    def key(self, kid: str | None) -> Key | None:
        """The key ``kid`` names (without a kid: the only key, if there is one), None if the
        issuer has no such key; AuthUnavailable when the keys cannot be fetched."""
        with self._lock:
            now = time.monotonic()
            keys = self._keys
            stale = keys is None or now - self._fetched >= self.lifespan
            unknown = keys is not None and _find(keys, kid) is None
            if stale or (unknown and now - self._fetched >= self.min_refresh):
                if self._failed is not None and now - self._failed[0] < self.retry_after:
                    raise AuthUnavailable(self._failed[1])
                try:
                    keys = self._fetch()
                except AuthUnavailable as err:
                    self._failed = (time.monotonic(), str(err))
                    raise
                self._keys, self._fetched, self._failed = keys, time.monotonic(), None
            assert keys is not None
            return _find(keys, kid)

    def _fetch(self) -> list[Key]:
        def unavailable(why: str) -> AuthUnavailable:
            return AuthUnavailable(f"cannot fetch the OIDC issuer's keys from {self.url}: {why}")

        request = urllib.request.Request(
            self.url, headers={"Accept": "application/json", "User-Agent": "stackflow-api"}
        )
        deadline = time.monotonic() + self.timeout
        body = b""
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                while chunk := response.read(65536):
                    body += chunk
                    if len(body) > JWKS_MAX_BYTES:
                        raise unavailable(f"more than {JWKS_MAX_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise unavailable(f"no answer in {self.timeout:g} s")
        except urllib.error.HTTPError as err:
            raise unavailable(f"HTTP {err.code}") from None
        except urllib.error.URLError as err:
            raise unavailable(str(err.reason)) from None
        except TimeoutError:
            raise unavailable(f"no answer in {self.timeout:g} s") from None
        except (OSError, ValueError) as err:
            raise unavailable(str(err) or type(err).__name__) from None
        try:
            data = json.loads(body)
        except ValueError:
            raise unavailable("not JSON") from None
        raw = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(raw, list):
            raise unavailable('not a JWK set (no "keys" list)')
        keys = []
        for item in raw:
            if not isinstance(item, dict) or item.get("kty") == "oct":
                continue  # a shared secret never verifies an API credential
            if item.get("use", "sig") != "sig" or "d" in item:
                continue  # an encryption key, or a private one published by mistake
            try:
                jwk = jwt.PyJWK.from_dict(item)
            except (jwt.PyJWTError, ValueError, TypeError):
                continue  # a key type or curve this process cannot use
            kid, alg = item.get("kid"), item.get("alg")
            kid = kid if isinstance(kid, str) else None
            keys.append(Key(kid, jwk, alg if isinstance(alg, str) else None))
        if not keys:
            raise unavailable("no usable signing key in it")
        return keys


def _find(keys: list[Key], kid: str | None) -> Key | None:
    if kid is None:
        return keys[0] if len(keys) == 1 else None
    return next((key for key in keys if key.kid == kid), None)


class InvalidToken(Exception):
    """Why a JWT is refused (one line, never the token)."""


class OidcVerifier:
    """Turns a JWT of the configured issuer into an :class:`Identity`."""

    def __init__(self, config: OidcConfig, jwks: Jwks | None = None) -> None:
        self.config = config
        self.jwks = jwks or Jwks(config.jwks_url)

    def authenticate(self, token: str) -> Identity | None:
        """The caller, or None for a token that is not valid (why is logged); AuthUnavailable
        when the keys cannot be fetched. Blocks while they are."""
        try:
            return self.verify(token)
        except InvalidToken as err:
            log.info("OIDC token refused: %s", err)
            return None

    def verify(self, token: str) -> Identity:
        """The caller; InvalidToken saying why not, AuthUnavailable as for :meth:`authenticate`."""
        config = self.config
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, ValueError) as err:
            raise InvalidToken(f"not a JWT: {err}") from None
        alg = header.get("alg")
        if alg not in config.algorithms:
            raise InvalidToken(f"algorithm {alg!r} is not one of {', '.join(config.algorithms)}")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("kid is not a string")
        key = self.jwks.key(kid)
        if key is None:
            raise InvalidToken(
                f"the issuer has no key {kid!r}"
                if kid is not None
                else "no kid, and the issuer has more than one key"
            )
        if key.alg is not None and key.alg != alg:
            raise InvalidToken(f"key {kid!r} is for {key.alg}, the token says {alg}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.jwk.key,
                algorithms=[alg],
                audience=config.audience,
                issuer=config.issuer,
                leeway=config.leeway_seconds,
                options={"require": ["exp", "iss", "aud"]},
            )
        except (jwt.PyJWTError, ValueError, TypeError) as err:
            raise InvalidToken(str(err) or type(err).__name__) from None
        return Identity(name=self.name_of(claims), roles=self.roles_of(claims))

    def name_of(self, claims: dict[str, Any]) -> str:
        claim = self.config.identity_claim
        name = claims.get(claim)
        if not isinstance(name, str) or not name.strip():
            raise InvalidToken(f"no {claim} claim (a non-empty string)")
        if len(name) > NAME_MAX:
            raise InvalidToken(f"the {claim} claim is over {NAME_MAX} characters")
        if any(unicodedata.category(c) in _REFUSED_CATEGORIES for c in name):
            raise InvalidToken(f"the {claim} claim has control characters")
        return name

    def roles_of(self, claims: dict[str, Any]) -> dict[str, Role]:
        """The role per glob: the highest that any value of the roles claim gives it."""
        value = claims.get(self.config.roles_claim)
        values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        roles: dict[str, Role] = {}
        for group in values:
            if not isinstance(group, str):
                continue
            for glob, role in self.config.roles.get(group, {}).items():
                roles[glob] = max(role, roles.get(glob, role))
        return roles
