"""OIDC JWTs as API credentials, without Temporal: real RSA and EC keys, a real JWKS served
over HTTP on loopback, tokens signed with PyJWT; the token table verifies them (signature,
exp/nbf, iss, aud, asymmetric algorithms only) and maps the roles claim to roles per project
glob; the guard answers 401 for a bad one and 503 when the keys cannot be fetched; static
tokens keep working beside them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from temporalio.client import Client

from stackflow.api.app import create_app
from stackflow.api.auth import TokenTable, parse_tokens, token_hash
from stackflow.api.identity import AuthUnavailable, Role
from stackflow.api.oidc import InvalidToken, Jwks, OidcConfig, OidcVerifier
from stackflow.core.errors import SpecError
from stackflow.state.backend import open_backend

ISSUER, AUDIENCE = "https://idp.example/realms/acme", "stackflow"
ROLES = {
    "devs": {"team-*": "viewer"},
    "ops": {"team-*": "operator", "team-a": "approver"},
}


@dataclass
class Keys:
    rsa_key: rsa.RSAPrivateKey
    ec_key: ec.EllipticCurvePrivateKey
    other_key: rsa.RSAPrivateKey  # a key the issuer does not publish (until it rotates to it)


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(
        rsa_key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec_key=ec.generate_private_key(ec.SECP256R1()),
        other_key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


def jwk_of(key: Any, kid: str, alg: str) -> dict[str, Any]:
    algorithm = jwt.algorithms.RSAAlgorithm if alg.startswith("RS") else jwt.algorithms.ECAlgorithm
    public = json.loads(algorithm.to_jwk(key.public_key()))
    return {**public, "kid": kid, "alg": alg, "use": "sig"}


@dataclass
class Idp:
    """The issuer's JWKS endpoint: what it serves can change, and it counts requests."""

    url: str
    keys: list[dict[str, Any]]
    status: int = 200
    delay: float = 0.0
    hits: list[float] = field(default_factory=list)
    gate: threading.Event | None = None
    """When set, each request waits until the gate opens (20 s at most) before answering."""


@pytest.fixture
def idp(keys: Keys) -> Iterator[Idp]:
    state = Idp("", [jwk_of(keys.rsa_key, "rsa1", "RS256"), jwk_of(keys.ec_key, "ec1", "ES256")])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits.append(time.monotonic())
            time.sleep(state.delay)
            if state.gate is not None:
                state.gate.wait(20)
            body = json.dumps({"keys": state.keys}).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/realms/acme/certs"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/jwks"


def oidc_section(jwks_url: str, **over: Any) -> dict[str, Any]:
    return {
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "jwks_url": jwks_url,
        "identity_claim": "email",
        "roles_claim": "groups",
        "roles": ROLES,
        **over,
    }


def table_for(jwks_url: str, **over: Any) -> TokenTable:
    static = {"name": "ci", "sha256": token_hash("a.b.c"), "roles": {"*": "operator"}}
    return parse_tokens(
        json.dumps({"tokens": [static], "oidc": oidc_section(jwks_url, **over)}), "tokens.json"
    )


def claims(**over: Any) -> dict[str, Any]:
    now = int(time.time())
    body = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "0f3c9a",
        "email": "alice@example.com",
        "groups": ["devs", "ops", "unmapped"],
        "iat": now,
        "nbf": now,
        "exp": now + 300,
        **over,
    }
    return {k: v for k, v in body.items() if v is not None}


def sign(key: Any, alg: str = "RS256", kid: str | None = "rsa1", **over: Any) -> str:
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(claims(**over), key, alg, headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_with(secret: bytes, kid: str) -> str:
    """An HS256 JWT whose secret is ``secret`` (PyJWT refuses to make one from a PEM key)."""
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = b64(json.dumps(claims()).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


def test_a_valid_token_is_the_identity_with_the_roles_of_its_groups(idp: Idp, keys: Keys) -> None:
    table = table_for(idp.url)
    who = table.authenticate(sign(keys.rsa_key))
    assert who is not None and who.name == "alice@example.com"
    assert who.role_for("team-a") == Role.approver  # ops: the highest matching glob
    assert who.role_for("team-b") == Role.operator  # ops beats devs
    assert who.role_for("other") is None
    # an EC key, a roles claim that is one string, the default identity claim (sub)
    ec_only = table_for(idp.url, identity_claim="sub")
    who = ec_only.authenticate(sign(keys.ec_key, "ES256", "ec1", groups="devs"))
    assert who is not None and who.name == "0f3c9a"
    assert who.allows("team-x", Role.viewer) and not who.allows("team-x", Role.operator)
    # valid, but no group that has a role: authenticated, allowed nothing
    who = table.authenticate(sign(keys.rsa_key, groups=["unmapped"]))
    assert who is not None and who.roles == {} and who.role_for("team-a") is None
    assert len(idp.hits) == 2  # once per table (its first token), then cached


def test_static_tokens_work_beside_oidc(idp: Idp) -> None:
    table = table_for(idp.url)
    who = table.authenticate("a.b.c")  # two dots, but no JWT header: the static table
    assert who is not None and who.name == "ci" and who.role_for("p") == Role.operator
    assert table.authenticate("x.y.z") is None
    assert table.authenticate("x.y\udcff.z") is None  # not UTF-8: no crash
    assert idp.hits == []  # never asked the issuer


def public_pem(k: Keys) -> bytes:
    return k.rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


FORGED: list[tuple[str, Callable[[Keys], str], str]] = [
    ("expired", lambda k: sign(k.rsa_key, exp=int(time.time()) - 120), "Signature has expired"),
    ("no-exp", lambda k: sign(k.rsa_key, exp=None), 'missing the "exp" claim'),
    (
        "not-yet-valid",
        lambda k: sign(k.rsa_key, nbf=int(time.time()) + 600),
        r"not yet valid \(nbf",
    ),
    ("issued-later", lambda k: sign(k.rsa_key, iat=int(time.time()) + 600), r"not yet valid \(iat"),
    ("wrong-aud", lambda k: sign(k.rsa_key, aud="another-app"), "Audience doesn't match"),
    ("no-aud", lambda k: sign(k.rsa_key, aud=None), 'missing the "aud" claim'),
    ("wrong-iss", lambda k: sign(k.rsa_key, iss="https://evil.example"), "Invalid issuer"),
    ("wrong-key-same-kid", lambda k: sign(k.other_key), "Signature verification failed"),
    ("bad-signature", lambda k: sign(k.rsa_key)[:-4] + "AAAA", "Signature verification failed"),
    ("unknown-kid", lambda k: sign(k.other_key, kid="rsa9"), "the issuer has no key 'rsa9'"),
    ("no-kid-two-keys", lambda k: sign(k.rsa_key, kid=None), "no kid, and the issuer has more"),
    ("alg-not-configured", lambda k: sign(k.rsa_key, "RS384"), "'RS384' is not one of RS256"),
    ("ec-token-rsa-key", lambda k: sign(k.ec_key, "ES256", "rsa1"), "'rsa1' is for RS256"),
    ("alg-none", lambda k: jwt.encode(claims(), "", "none", {"kid": "rsa1"}), "'none' is not"),
    ("hs256-public-key", lambda k: hs256_with(public_pem(k), "rsa1"), "'HS256' is not one of"),
    ("control-char", lambda k: sign(k.rsa_key, email="alice\x1b[2J"), "has control characters"),
    ("bidi", lambda k: sign(k.rsa_key, email="alice\u202emoc.elpmaxe"), "has control characters"),
    ("newline", lambda k: sign(k.rsa_key, email="alice\nby: bob"), "has control characters"),
    ("name-too-long", lambda k: sign(k.rsa_key, email="a" * 201), "over 200 characters"),
    ("no-identity-claim", lambda k: sign(k.rsa_key, email=None), "no email claim"),
    ("identity-not-a-string", lambda k: sign(k.rsa_key, email=["alice"]), "no email claim"),
]


@pytest.mark.parametrize(("forge", "why"), [pytest.param(f, w, id=i) for i, f, w in FORGED])
def test_invalid_tokens_are_refused(
    idp: Idp, keys: Keys, forge: Callable[[Keys], str], why: str
) -> None:
    table = table_for(idp.url)
    assert table.authenticate(sign(keys.rsa_key)) is not None  # the same table takes a good one
    token = forge(keys)
    assert table.authenticate(token) is None
    assert table.oidc is not None
    with pytest.raises(InvalidToken, match=why):
        table.oidc.verify(token)


def test_an_issuer_that_cannot_be_reached_is_unavailable_never_accepted(
    idp: Idp, keys: Keys
) -> None:
    down = table_for(closed_port_url())
    with pytest.raises(AuthUnavailable, match="cannot fetch the OIDC issuer's keys from"):
        down.authenticate(sign(keys.rsa_key))
    idp.status = 500
    failing = table_for(idp.url)
    with pytest.raises(AuthUnavailable, match="HTTP 500"):
        failing.authenticate(sign(keys.rsa_key))
    # failed a moment ago: the next request is refused at once, the issuer not asked again
    with pytest.raises(AuthUnavailable, match="HTTP 500"):
        failing.authenticate(sign(keys.rsa_key))
    assert len(idp.hits) == 1
    private = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys.rsa_key))
    idp.status, idp.keys = 200, [{"kty": "oct", "k": "c2VjcmV0", "kid": "hs"}, private]
    only_secret = table_for(idp.url)
    with pytest.raises(AuthUnavailable, match="no usable signing key"):
        only_secret.authenticate(sign(keys.rsa_key))
    # a token that is no JWT of an allowed algorithm never makes the issuer be asked
    assert down.authenticate(jwt.encode(claims(), "", "none", {"kid": "rsa1"})) is None


def test_unknown_key_ids_fetch_again_at_most_every_min_refresh(idp: Idp, keys: Keys) -> None:
    config = OidcConfig.model_validate(oidc_section(idp.url))
    verifier = OidcVerifier(config)  # the default: at most every 30 s
    assert verifier.authenticate(sign(keys.rsa_key)) is not None
    for _ in range(5):
        assert verifier.authenticate(sign(keys.other_key, kid="rsa2")) is None
    assert len(idp.hits) == 1
    # the issuer rotates to a new key: a verifier that may fetch again now takes it
    rotating = OidcVerifier(config, Jwks(idp.url, min_refresh=0))
    assert rotating.authenticate(sign(keys.rsa_key)) is not None
    assert rotating.authenticate(sign(keys.other_key, kid="rsa2")) is None
    idp.keys.append(jwk_of(keys.other_key, "rsa2", "RS256"))
    who = rotating.authenticate(sign(keys.other_key, kid="rsa2"))
    assert who is not None and who.name == "alice@example.com"


def test_a_key_without_kid_is_used_when_it_is_the_only_one(idp: Idp, keys: Keys) -> None:
    idp.keys = [{k: v for k, v in jwk_of(keys.ec_key, "x", "ES256").items() if k != "kid"}]
    table = table_for(idp.url)
    assert table.authenticate(sign(keys.ec_key, "ES256", kid=None)) is not None
    assert table.authenticate(sign(keys.ec_key, "ES256", kid="ec1")) is None


async def no_temporal() -> Client:
    raise RuntimeError("Failed client connect: tcp connect error: connection refused")


async def client_for(table: TokenTable, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    backend = open_backend(f"sqlite:///{tmp_path / 'state.db'}")
    app = create_app(no_temporal, backend, table)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client
    backend.close()


def problem_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["type"].startswith("urn:stackflow:problem:")
    return body


async def test_the_api_takes_oidc_callers_with_their_roles(
    idp: Idp, keys: Keys, tmp_path: Path
) -> None:
    async for http in client_for(table_for(idp.url), tmp_path):
        good = {"Authorization": f"Bearer {sign(keys.rsa_key, groups=['devs'])}"}
        assert (await http.get("/v1/stacks/team-a/w/releases", headers=good)).json() == []
        r = await http.post("/v1/stacks/team-a/w/runs", json={"operation": "apply"}, headers=good)
        assert problem_of(r, 403)["detail"] == (
            "alice@example.com is viewer on project team-a; this needs operator"
        )
        expired = {"Authorization": f"Bearer {sign(keys.rsa_key, exp=int(time.time()) - 120)}"}
        r = await http.get("/v1/stacks/team-a/w/releases", headers=expired)
        assert problem_of(r, 401)["detail"] == "the bearer token is not valid"
        assert r.headers["www-authenticate"] == "Bearer"
        static = {"Authorization": "Bearer a.b.c"}
        assert (await http.get("/v1/stacks/team-a/w/releases", headers=static)).json() == []


async def test_the_api_answers_503_when_the_issuer_is_down(keys: Keys, tmp_path: Path) -> None:
    async for http in client_for(table_for(closed_port_url()), tmp_path):
        headers = {"Authorization": f"Bearer {sign(keys.rsa_key)}"}
        r = await http.get("/v1/stacks/team-a/w/releases", headers=headers)
        body = problem_of(r, 503)
        assert body["type"] == "urn:stackflow:problem:identity-provider-unavailable"
        assert body["detail"].startswith(
            "cannot fetch the OIDC issuer's keys from http://127.0.0.1:"
        )
        static = {"Authorization": "Bearer a.b.c"}  # static tokens do not need the issuer
        assert (await http.get("/v1/stacks/team-a/w/releases", headers=static)).json() == []


async def test_a_slow_issuer_does_not_hold_up_other_requests(
    idp: Idp, keys: Keys, tmp_path: Path
) -> None:
    """The issuer answers only when the test lets it: another request is answered meanwhile
    (a fetch that held the event loop would hold this one until the gate's 20 s ran out, and
    the slow request would be done by then)."""
    idp.gate = threading.Event()
    async for http in client_for(table_for(idp.url), tmp_path):
        headers = {"Authorization": f"Bearer {sign(keys.rsa_key)}"}
        slow = asyncio.create_task(http.get("/v1/stacks/team-a/w/releases", headers=headers))
        for _ in range(1000):  # the JWKS fetch has reached the issuer
            if idp.hits:
                break
            await asyncio.sleep(0.01)
        assert idp.hits, "the slow request never asked the issuer"
        assert (await http.get("/v1/healthz")).status_code == 200
        assert not slow.done()  # answered while the issuer still held the fetch
        idp.gate.set()
        assert (await slow).json() == []


def test_the_yaml_form_with_oidc_only() -> None:
    table = parse_tokens(
        "oidc:\n"
        f"  issuer: {ISSUER}\n"
        f"  audience: {AUDIENCE}\n"
        "  jwks_url: https://idp.example/realms/acme/certs\n"
        "  roles:\n"
        "    platform: {'*': approver}\n"
    )
    assert table.entries == [] and table.oidc is not None
    config = table.oidc.config
    assert config.algorithms == ["RS256", "ES256"] and config.identity_claim == "sub"
    assert config.roles_claim == "groups" and config.leeway_seconds == 30
    assert config.roles == {"platform": {"*": Role.approver}}
    assert parse_tokens('{"tokens": []}').oidc is None  # no section, no OIDC


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"audence": "x"}, "tokens.json: oidc: audence: unknown field"),
        ({"jwks_url": None}, "tokens.json: oidc: jwks_url: Field required"),
        ({"jwks_url": "http://idp.example/certs"}, "oidc: jwks_url: Value error, an https://"),
        ({"jwks_url": "file:///etc/jwks.json"}, "oidc: jwks_url: Value error, an https://"),
        ({"algorithms": ["HS256"]}, "oidc: algorithms: Value error, 'HS256': use RS256"),
        ({"algorithms": ["RS256", "none"]}, "'none': use RS256, RS384"),
        ({"algorithms": []}, "oidc: algorithms: List should have at least 1 item"),
        ({"roles": {"devs": {"*": "admin"}}}, "oidc: roles: Value error, devs: role 'admin'"),
        ({"roles": {"devs": ["viewer"]}}, "oidc: roles.devs: Input should be a valid dict"),
        ({"leeway_seconds": -1}, "oidc: leeway_seconds: Input should be greater than"),
        ({"identity_claim": ""}, "oidc: identity_claim: String should have at least 1"),
    ],
)
def test_bad_oidc_sections_name_the_field(over: dict[str, Any], message: str) -> None:
    section = {**oidc_section("https://idp.example/certs"), **over}
    section = {k: v for k, v in section.items() if v is not None}  # None: left out
    with pytest.raises(SpecError) as err:
        parse_tokens(json.dumps({"tokens": [], "oidc": section}), "tokens.json")
    text = str(err.value)
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tokens": [], "oidcc": {}}, "tokens.json: oidcc: unknown field (use tokens and oidc)"),
        ({"oidc": "https://idp.example"}, "tokens.json: oidc: entry: Input should be a valid"),
        ({"tokens": {"name": "a"}}, "tokens.json: a list of tokens"),
    ],
)
def test_bad_top_levels_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_tokens(json.dumps(data), "tokens.json")
    assert str(err.value).startswith(message), str(err.value)
