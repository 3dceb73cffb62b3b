"""`orchestrator.source.connect`: one TLS context per process for pymysql's PREFERRED mode,
the same context pymysql builds itself, and a connection's own TLS options left alone."""

from __future__ import annotations

import ssl
from typing import Any

import pymysql

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


def test_tls_options_of_a_connection_build_its_own_context() -> None:
    shared = unconnected().ctx
    own = unconnected(ssl_verify_cert=True)
    assert own.ctx is not shared and own._ssl_required and own.ctx.verify_mode == ssl.CERT_REQUIRED
    assert unconnected(ssl_disabled=True).ssl is False
