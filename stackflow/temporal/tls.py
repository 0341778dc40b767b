"""How stackflow's processes authenticate to Temporal and encrypt the connection: TLS, mTLS
and API keys, set with the environment variables Temporal's own CLI reads (``temporal
--help``: v1.x names), so one environment serves both:

- ``TEMPORAL_TLS``: ``true``/``false``; unset, TLS is on as soon as any setting below is;
- ``TEMPORAL_TLS_CLIENT_CERT_PATH`` / ``_DATA`` and ``TEMPORAL_TLS_CLIENT_KEY_PATH`` /
  ``_DATA``: the client certificate and its key (mTLS; both or neither);
- ``TEMPORAL_TLS_SERVER_CA_CERT_PATH`` / ``_DATA``: the CA the server's certificate must chain
  to (unset: the system's roots);
- ``TEMPORAL_TLS_SERVER_NAME``: the name the server's certificate must carry (and SNI), when
  it is not the address's host;
- ``TEMPORAL_API_KEY``: a bearer API key (Temporal Cloud), sent over TLS.

``_PATH`` files are read by the process when it connects (the worker and ``stackflow serve``
at start: a rotated certificate takes a restart). Anything wrong (a file that cannot be read
or is not PEM, a certificate without its key, a key that is not the certificate's, PATH and
DATA both set, ``TEMPORAL_TLS=false`` with TLS settings, a setting of the older CLI's names
``TEMPORAL_TLS_CERT``/``_KEY``/``_CA``) is one :class:`TemporalSettingsError` line (exit 2)
before any connection. ``TEMPORAL_TLS_DISABLE_HOST_VERIFICATION=true`` is refused: the SDK
cannot skip the check, and stackflow would not; name the certificate's host with
``TEMPORAL_TLS_SERVER_NAME`` instead."""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from temporalio.service import TLSConfig

from stackflow.core.errors import StackflowError

CERT = "TEMPORAL_TLS_CLIENT_CERT"
KEY = "TEMPORAL_TLS_CLIENT_KEY"
CA = "TEMPORAL_TLS_SERVER_CA_CERT"
TLS = "TEMPORAL_TLS"
SERVER_NAME = "TEMPORAL_TLS_SERVER_NAME"
NO_HOST_CHECK = "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION"
API_KEY = "TEMPORAL_API_KEY"
OLD_NAMES = {
    "TEMPORAL_TLS_CERT": f"{CERT}_PATH",
    "TEMPORAL_TLS_KEY": f"{KEY}_PATH",
    "TEMPORAL_TLS_CA": f"{CA}_PATH",
}
"""The Temporal CLI's names before v1.0 (and tctl's): refused, never silently ignored (a
deployment that set them would otherwise connect in plaintext)."""
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
PEM_CERT = b"-----BEGIN CERTIFICATE-----"
MAX_PEM = 1024 * 1024


class TemporalSettingsError(StackflowError):
    """A TLS or API key setting of the Temporal connection is wrong: exit 2, before any
    connection."""

    exit_code = 2


@dataclass(frozen=True)
class TemporalTLS:
    """The TLS/mTLS/API key half of a Temporal connection, read (and checked) from the
    environment by :meth:`from_env`."""

    enabled: bool = False
    client_cert: bytes | None = None
    client_key: bytes | None = None
    server_ca: bytes | None = None
    server_name: str | None = None
    api_key: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TemporalTLS:
        env = os.environ if environ is None else environ
        for old, new in OLD_NAMES.items():
            if env.get(old, "").strip() and not _set(env, new):
                raise TemporalSettingsError(
                    f"{old} is the older Temporal CLI's name, which stackflow does not read: "
                    f"set {new} (or {new.removesuffix('_PATH')}_DATA) instead"
                )
        if _flag(env, NO_HOST_CHECK):
            raise TemporalSettingsError(
                f"{NO_HOST_CHECK}=true is not supported: set {SERVER_NAME} to the name the "
                "server's certificate carries instead"
            )
        cert, key = _pem(env, CERT), _pem(env, KEY)
        if (cert is None) != (key is None):
            have, need = (CERT, KEY) if key is None else (KEY, CERT)
            raise TemporalSettingsError(
                f"{have}_PATH (or _DATA) is set but {need}_PATH (or _DATA) is not: mTLS needs "
                "both the client certificate and its private key"
            )
        if cert is not None and key is not None:
            _check_pair(cert, key)
        ca = _pem(env, CA)
        server_name = env.get(SERVER_NAME, "").strip() or None
        api_key = env.get(API_KEY, "").strip() or None
        configured = [
            name
            for name, value in ((CERT, cert), (CA, ca), (SERVER_NAME, server_name))
            if value is not None
        ]
        explicit = _flag(env, TLS)
        if explicit is False and configured:
            raise TemporalSettingsError(
                f"{TLS}=false, but {configured[0]}{'' if configured[0] == SERVER_NAME else '_PATH'}"
                " is set: unset one of them"
            )
        enabled = explicit if explicit is not None else bool(configured or api_key)
        return cls(enabled, cert, key, ca, server_name, api_key)

    def tls_config(self) -> TLSConfig | bool:
        """What ``Client.connect(tls=…)`` takes."""
        if not self.enabled:
            return False
        return TLSConfig(
            server_root_ca_cert=self.server_ca,
            domain=self.server_name,
            client_cert=self.client_cert,
            client_private_key=self.client_key,
        )

    def describe(self) -> str:
        """How this connects, for start-up lines and errors (never a secret)."""
        if not self.enabled:
            how = "plaintext (no TLS)"
        elif self.client_cert is not None:
            how = "mTLS (client certificate)"
        else:
            how = "TLS"
        if self.enabled and self.server_ca is not None:
            how += ", server CA from " + CA
        if self.server_name:
            how += f", server name {self.server_name}"
        return how + (", API key" if self.api_key else "")

    def diagnose(self, address: str, timeout: float = 5.0) -> str | None:
        """Why a server that closed the connection as soon as it opened did so, when TLS is
        the reason, else None. With TLS 1.3 a server that refuses this client's certificate
        says so after the handshake, and the SDK's first call may only see the connection
        closed: one handshake here, with the same settings, reads the server's alert
        (``TLSV13_ALERT_CERTIFICATE_REQUIRED``). Without TLS: whether the port speaks TLS."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as raw:
                if not self.enabled:
                    return _speaks_tls(raw, host)
                context = self._context()
                with context.wrap_socket(raw, server_hostname=self.server_name or host) as tls:
                    tls.recv(1)  # a server that accepts us sends its HTTP/2 settings at once
        except ssl.SSLCertVerificationError as err:
            return f"the server's certificate: {err.verify_message or err.reason}"
        except ssl.SSLError as err:
            # the server's verdict (an alert), not a connection that just ended mid-way
            why = str(err.reason or "")
            return why if "ALERT" in why or "WRONG_VERSION" in why else None
        except (OSError, ValueError):
            return None
        return None

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.set_alpn_protocols(["h2"])
        if self.server_ca is not None:
            context.load_verify_locations(cadata=self.server_ca.decode(errors="replace"))
        if self.client_cert is not None and self.client_key is not None:
            with tempfile.TemporaryDirectory() as directory:  # load_cert_chain reads files
                cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
                cert.write_bytes(self.client_cert)
                key.touch(0o600)
                key.write_bytes(self.client_key)
                context.load_cert_chain(cert, key)
        return context

    @classmethod
    def enabled_in_env(cls) -> bool:
        """Whether the environment's settings turn TLS on (False when they are wrong)."""
        try:
            return cls.from_env().enabled
        except TemporalSettingsError:
            return False

    @classmethod
    def describe_env(cls) -> str:
        """``describe()`` of the environment's settings (or why they are wrong)."""
        try:
            return cls.from_env().describe()
        except TemporalSettingsError as err:
            return f"settings in error ({err})"


def _set(env: Mapping[str, str], name: str) -> bool:
    return bool(env.get(name, "").strip())


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    value = env.get(name, "").strip().lower()
    if not value:
        return None
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise TemporalSettingsError(f"{name}={value[:20]!r}: use true or false")


def _pem(env: Mapping[str, str], prefix: str) -> bytes | None:
    """``<prefix>_PATH``'s file or ``<prefix>_DATA``'s text, checked to be PEM of its kind."""
    path, data = env.get(f"{prefix}_PATH", "").strip(), env.get(f"{prefix}_DATA", "").strip()
    if path and data:
        raise TemporalSettingsError(f"{prefix}_PATH and {prefix}_DATA are both set: keep one")
    if path:
        where = f"{prefix}_PATH={path}"
        try:
            with open(path, "rb") as file:
                raw = file.read(MAX_PEM + 1)
        except OSError as err:
            raise TemporalSettingsError(
                f"{where}: cannot read it ({err.strerror or err})"
            ) from None
        if len(raw) > MAX_PEM:
            raise TemporalSettingsError(f"{where}: over {MAX_PEM} bytes, not a PEM file")
    elif data:
        where, raw = f"{prefix}_DATA", data.encode()
    else:
        return None
    wanted = b"PRIVATE KEY-----" if prefix == KEY else PEM_CERT
    if wanted not in raw:
        kind = "private key" if prefix == KEY else "certificate"
        raise TemporalSettingsError(f"{where}: not a PEM {kind} (no '{wanted.decode()}')")
    return raw


def _check_pair(cert: bytes, key: bytes) -> None:
    """The key must be the certificate's: else the server's refusal would only say the
    handshake failed."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
    )

    try:
        public = x509.load_pem_x509_certificate(cert).public_key()
    except ValueError as err:
        raise TemporalSettingsError(f"{CERT}: not a readable certificate ({err})") from None
    try:
        private = load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as err:
        raise TemporalSettingsError(
            f"{KEY}: not a readable unencrypted private key ({str(err).splitlines()[0][:120]})"
        ) from None
    spki = Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*spki) != public.public_bytes(*spki):
        raise TemporalSettingsError(f"{KEY} is not the key of the certificate {CERT} names")


def _speaks_tls(raw: socket.socket, host: str) -> str | None:
    """A plaintext client's diagnosis: the port answers a TLS handshake (its certificate
    unchecked, nothing sent after it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(raw, server_hostname=host):
            pass
    except ssl.SSLError as err:
        if "ALERT" not in str(err.reason or ""):
            return None  # not TLS
    return (
        f"it speaks TLS and this client does not: set {TLS}=true (and {CERT}_PATH/{KEY}_PATH "
        f"for mTLS, {CA}_PATH for a private CA)"
    )
