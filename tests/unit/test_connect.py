"""`orchestrator.source.connect`: one TLS context per process for pymysql's PREFERRED mode,
the same context pymysql builds itself, and a connection's own TLS options left alone."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import pymysql
import pytest

from orchestrator.source import connect as tls


def unconnected(**settings: Any) -> Any:
    """A connection object whose socket is never opened (``defer_connect``)."""
    return tls.connect(host="127.0.0.1", port=1, defer_connect=True, **settings)


def test_connections_without_tls_options_share_one_context() -> None:
    first, second = unconnected(), unconnected()
    assert first.ctx is second.ctx
    assert first.ssl and not first._ssl_required  # still PREFERRED: TLS if the server offers it


def test_the_shared_context_is_the_one_pymysql_builds() -> None:
    ours = unconnected().ctx
    theirs = pymysql.connect(host="127.0.0.1", port=1, defer_connect=True).ctx
    assert ours is not theirs
    assert (ours.verify_mode, ours.check_hostname, ours.verify_flags, ours.options) == (
        theirs.verify_mode,
        theirs.check_hostname,
        theirs.verify_flags,
        theirs.options,
    )
    assert ours.verify_mode == ssl.CERT_NONE
    assert ours.minimum_version == theirs.minimum_version
    assert ours.cert_store_stats()["x509"] == 0  # nothing loaded that nothing checks


def test_tls_options_of_a_connection_build_its_own_context() -> None:
    shared = unconnected().ctx
    own = unconnected(ssl_verify_cert=True)
    assert own.ctx is not shared and own._ssl_required and own.ctx.verify_mode == ssl.CERT_REQUIRED
    assert unconnected(ssl_disabled=True).ssl is False


def test_the_shared_context_completes_a_handshake_with_a_self_signed_server(
    tmp_path: Path,
) -> None:
    """PREFERRED mode takes whatever certificate the server shows: the context without CA
    certificates completes the handshake a verifying context refuses."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=mariadb.invalid", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in range(2):
                conn, _ = listener.accept()
                with (
                    contextlib.suppress(ssl.SSLError, OSError),
                    server_context.wrap_socket(conn, server_side=True) as tls_conn,
                ):
                    tls_conn.sendall(b"ok")
                conn.close()

        server = threading.Thread(target=serve, daemon=True)
        server.start()

        def handshake(context: ssl.SSLContext) -> bytes:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                context.wrap_socket(raw, server_hostname="mariadb.invalid") as client,
            ):
                return client.recv(2)

        assert handshake(unconnected().ctx) == b"ok"
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(ssl.create_default_context())
        server.join(timeout=10)
