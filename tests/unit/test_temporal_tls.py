"""The Temporal connection's TLS, mTLS and API key settings (``stackflow.temporal.tls``): the
Temporal CLI's variable names, each wrong setting one line (exit 2) before any connection, and
a TLS handshake the server refuses classified as a refusal (one line), never as an outage the
CLI waits out."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from stackflow.temporal import client as temporal_client
from stackflow.temporal.tls import TemporalSettingsError, TemporalTLS
from tests.tlscerts import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("other"), prefix="other-")


def mtls_env(pki: Pki) -> dict[str, str]:
    return {
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(pki.client.cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pki.client.key),
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pki.ca),
    }


def refused(env: dict[str, str]) -> str:
    with pytest.raises(TemporalSettingsError) as err:
        TemporalTLS.from_env(env)
    assert err.value.exit_code == 2
    line = str(err.value)
    assert "\n" not in line and len(line) < 300, line
    return line


def test_nothing_set_is_plaintext() -> None:
    tls = TemporalTLS.from_env({})
    assert tls.tls_config() is False and tls.api_key is None
    assert tls.describe() == "plaintext (no TLS)"


def test_mtls_from_paths_reads_the_files(pki: Pki) -> None:
    tls = TemporalTLS.from_env({**mtls_env(pki), "TEMPORAL_TLS_SERVER_NAME": "temporal.test"})
    config = tls.tls_config()
    assert isinstance(config, TLSConfig)
    assert config.client_cert == pki.client.cert.read_bytes()
    assert config.client_private_key == pki.client.key.read_bytes()
    assert config.server_root_ca_cert == pki.ca.read_bytes()
    assert config.domain == "temporal.test"
    assert tls.describe().startswith("mTLS (client certificate)")


def test_inline_data_and_api_key(pki: Pki) -> None:
    tls = TemporalTLS.from_env(
        {
            "TEMPORAL_TLS_SERVER_CA_CERT_DATA": pki.ca.read_text(),
            "TEMPORAL_API_KEY": "secret-key",
        }
    )
    config = tls.tls_config()
    assert isinstance(config, TLSConfig) and config.client_cert is None
    assert config.server_root_ca_cert == pki.ca.read_text().strip().encode()
    assert tls.api_key == "secret-key"
    assert "secret-key" not in tls.describe() and tls.describe().endswith("API key")


def test_api_key_alone_turns_tls_on_and_tls_false_turns_it_off() -> None:
    assert TemporalTLS.from_env({"TEMPORAL_API_KEY": "k"}).enabled
    assert TemporalTLS.from_env({"TEMPORAL_TLS": "true"}).tls_config() == TLSConfig()
    # as the Temporal CLI: an explicit TEMPORAL_TLS=false wins over the key's default
    assert not TemporalTLS.from_env({"TEMPORAL_API_KEY": "k", "TEMPORAL_TLS": "false"}).enabled


def test_a_certificate_without_its_key_is_refused(pki: Pki) -> None:
    line = refused({"TEMPORAL_TLS_CLIENT_CERT_PATH": str(pki.client.cert)})
    assert "TEMPORAL_TLS_CLIENT_CERT_PATH" in line and "TEMPORAL_TLS_CLIENT_KEY_PATH" in line
    line = refused({"TEMPORAL_TLS_CLIENT_KEY_DATA": pki.client.key.read_text()})
    assert line.startswith("TEMPORAL_TLS_CLIENT_KEY_PATH (or _DATA) is set but")


def test_a_missing_file_is_one_line_naming_it(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    line = refused({**mtls_env(pki), "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(missing)})
    assert line == (
        f"TEMPORAL_TLS_SERVER_CA_CERT_PATH={missing}: cannot read it (No such file or directory)"
    )


def test_not_pem_and_the_wrong_key_are_refused(pki: Pki, other: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    assert "not a PEM certificate" in refused(
        {**mtls_env(pki), "TEMPORAL_TLS_CLIENT_CERT_PATH": str(junk)}
    )
    # a certificate given as the key
    assert "not a PEM private key" in refused(
        {**mtls_env(pki), "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pki.client.cert)}
    )
    line = refused({**mtls_env(pki), "TEMPORAL_TLS_CLIENT_KEY_PATH": str(other.client.key)})
    assert line == (
        "TEMPORAL_TLS_CLIENT_KEY is not the key of the certificate TEMPORAL_TLS_CLIENT_CERT names"
    )


def test_contradictions_and_unknown_values_are_refused(pki: Pki) -> None:
    both = {
        **mtls_env(pki),
        "TEMPORAL_TLS_SERVER_CA_CERT_DATA": pki.ca.read_text(),
    }
    assert "_PATH and TEMPORAL_TLS_SERVER_CA_CERT_DATA are both set" in refused(both)
    assert "TEMPORAL_TLS=false, but TEMPORAL_TLS_CLIENT_CERT_PATH is set" in refused(
        {**mtls_env(pki), "TEMPORAL_TLS": "false"}
    )
    assert refused({"TEMPORAL_TLS": "maybe"}) == "TEMPORAL_TLS='maybe': use true or false"


def test_the_older_cli_names_are_refused_not_ignored(pki: Pki) -> None:
    """A deployment that set tctl's names would otherwise connect in plaintext."""
    line = refused({"TEMPORAL_TLS_CERT": str(pki.client.cert)})
    assert "set TEMPORAL_TLS_CLIENT_CERT_PATH" in line
    assert "TEMPORAL_TLS_SERVER_CA_CERT_PATH" in refused({"TEMPORAL_TLS_CA": str(pki.ca)})
    # beside the new name (one environment for an old tool too) it is left alone
    assert TemporalTLS.from_env({**mtls_env(pki), "TEMPORAL_TLS_CA": str(pki.ca)}).enabled


def test_disabling_host_verification_is_refused() -> None:
    assert "TEMPORAL_TLS_SERVER_NAME" in refused(
        {"TEMPORAL_TLS": "true", "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION": "true"}
    )
    assert TemporalTLS.from_env({"TEMPORAL_TLS_DISABLE_HOST_VERIFICATION": "false"}) == (
        TemporalTLS()
    )


@pytest.mark.parametrize(
    "message",
    [
        "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
        "hyper_util::client::legacy::Error(Connect, Custom { kind: InvalidData, error: "
        "InvalidCertificate(UnknownIssuer) }))",
        "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
        "received fatal alert: CertificateRequired)",
        # TLS spoken to a plaintext port (seen against a plain listener)
        "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
        "ConnectError(Custom { kind: InvalidData, error: InvalidMessage(InvalidContentType) }))",
    ],
)
def test_a_refused_handshake_is_a_refusal_not_an_outage(message: str) -> None:
    exc = RuntimeError(message)
    assert temporal_client.is_tls_refusal(exc)
    assert not temporal_client.is_unreachable(exc)
    err = temporal_client.connection_error(exc)
    assert isinstance(err, temporal_client.TemporalRefused)
    line = str(err)
    assert "refused the TLS connection" in line and "TEMPORAL_TLS_" in line and "\n" not in line


def test_outages_stay_outages() -> None:
    down = RuntimeError("Failed client connect: tcp connect error: Connection refused")
    assert temporal_client.is_unreachable(down) and not temporal_client.is_tls_refusal(down)
    # an address that names TLS is not a TLS error
    dns = RuntimeError(
        "Failed client connect: error trying to connect: dns error: failed to lookup address "
        "information for temporal-tls.ssl.internal"
    )
    assert temporal_client.is_unreachable(dns) and not temporal_client.is_tls_refusal(dns)
    rpc = RPCError("namespace x not found", RPCStatusCode.NOT_FOUND, b"")
    assert not temporal_client.is_tls_refusal(rpc)


def test_a_connection_closed_on_open_hints_at_tls_when_plaintext(
    monkeypatch: pytest.MonkeyPatch, pki: Pki
) -> None:
    """What a plaintext client of a TLS port sees (measured against the Temporal server with
    mTLS): still an outage (a proxy with its backend down looks the same), but the line
    after the wait says what to set."""
    closed = RuntimeError(
        "Failed client connect: `get_system_info` call error after connection: Status { code: "
        'Cancelled, message: "operation was canceled", source: Some(tonic::transport::Error('
        'Transport, hyper::Error(Canceled, "connection closed"))) }'
    )
    for name in ("TEMPORAL_TLS", "TEMPORAL_API_KEY", "TEMPORAL_TLS_SERVER_CA_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert temporal_client.is_unreachable(closed)
    assert "set TEMPORAL_TLS=true" in temporal_client.reason(closed)
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(pki.ca))
    assert "TEMPORAL_TLS" not in temporal_client.reason(closed)


STACKFLOW = Path(sys.executable).parent / "stackflow"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "command",
    [
        ["worker"],
        [sys.executable, "-m", "stackflow.worker"],
        ["serve", "--port", "9"],
        ["status", "--project", "p"],
    ],
    ids=["stackflow worker", "python -m stackflow.worker", "stackflow serve", "stackflow status"],
)
def test_each_process_stops_at_start_on_bad_settings(
    command: list[str], pki: Pki, tmp_path: Path
) -> None:
    """A certificate without its key: one line, exit 2, before any connection (the address
    is a closed port: nothing is tried)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_TLS", "TEMPORAL_API"))
    }
    env.update(
        TEMPORAL_ADDRESS="127.0.0.1:9",
        TEMPORAL_TLS_CLIENT_CERT_PATH=str(pki.client.cert),
        STACKFLOW_HOME=str(tmp_path / "home"),
        STACKFLOW_STATE_URL=f"sqlite:///{tmp_path / 'state.db'}",
        STACKFLOW_API_TOKENS=str(tmp_path / "tokens.json"),
    )
    (tmp_path / "tokens.json").write_text("[]")
    argv = command if command[0] == sys.executable else [str(STACKFLOW), *command]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip() == (
        "Error: TEMPORAL_TLS_CLIENT_CERT_PATH (or _DATA) is set but "
        "TEMPORAL_TLS_CLIENT_KEY_PATH (or _DATA) is not: mTLS needs both the client "
        "certificate and its private key"
    ), proc.stderr


class _Listener:
    """A loopback listener: with ``pki``, a TLS server that requires a client certificate of
    its CA (and writes one byte to a client it accepts); without, one that closes each
    connection at once (a proxy whose backend is down)."""

    def __init__(self, pki: Pki | None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.context: ssl.SSLContext | None = None
        if pki is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(pki.server.cert, pki.server.key)
            self.context.load_verify_locations(pki.ca)
            self.context.verify_mode = ssl.CERT_REQUIRED
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if self.context is None:
                    continue
                try:
                    with self.context.wrap_socket(conn, server_side=True) as tls:
                        tls.sendall(b"x")
                except (OSError, ssl.SSLError):
                    pass

    def close(self) -> None:
        self.sock.close()


def test_the_diagnosis_reads_the_servers_verdict(pki: Pki) -> None:
    """What ``connect`` asks when the server closed the connection as it opened."""
    tls_server, closer = _Listener(pki), _Listener(None)
    try:
        no_cert = TemporalTLS(enabled=True, server_ca=pki.ca.read_bytes())
        why = no_cert.diagnose(tls_server.address)
        assert why is not None and "CERTIFICATE_REQUIRED" in why, why
        mtls = TemporalTLS.from_env(mtls_env(pki))
        assert mtls.diagnose(tls_server.address) is None  # accepted: not TLS's doing
        plaintext = TemporalTLS().diagnose(tls_server.address)
        assert plaintext is not None and plaintext.startswith("it speaks TLS"), plaintext
        # a connection that just ends is no verdict: it stays an outage
        assert no_cert.diagnose(closer.address) is None
        assert TemporalTLS().diagnose(closer.address) is None
    finally:
        tls_server.close()
        closer.close()
