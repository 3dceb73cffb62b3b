"""``pymysql.connect`` with one TLS context per process instead of one per connection, and the
password sent as UTF-8.

pymysql sends a password given as text in latin-1 (1.1), so a password with a character
outside ASCII did not log in (one outside latin-1 failed to encode): the server checks the bytes
it was set with, UTF-8 from a utf8mb4 client, and MySQL's and MariaDB's clients and Connector/J
(Spark's reads) send those. `connect` hands pymysql the UTF-8 bytes.

Given no TLS option, pymysql (1.1 and later) asks for TLS when the server offers
it (its PREFERRED mode, without verifying the certificate) and builds a new
default ``ssl.SSLContext`` for each connection to do so. Loading the system's CA
certificates into it took 21 ms a connection on the benchmark machine (most of
what opening a connection costs), and a run opens several: the source, the
binlog's control and stream connections, a failover check. That context is the
same every time, so `connect` builds it once and every later connection reuses
it. It is pymysql's context without the CA certificates: PREFERRED mode verifies
neither the certificate nor the host name, so they were loaded (21 ms, once a
process) and never used; what each connection negotiates is unchanged. A
connection given TLS options of its own (``source.tls``, `orchestrator.source.tls`) builds its
context as before.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

import pymysql

from orchestrator.source.tls import unverified

_lock = threading.Lock()
_preferred: ssl.SSLContext | None = None


class _Connection(pymysql.connections.Connection):
    """A pymysql connection whose TLS context for PREFERRED mode is the process's one."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        global _preferred
        if not (isinstance(sslp, dict) and not sslp):  # TLS options of its own
            context: ssl.SSLContext = super()._create_ssl_ctx(sslp)
            return context
        with _lock:
            if _preferred is None:
                _preferred = unverified()
            return _preferred


def connect(**settings: Any) -> pymysql.connections.Connection[Any]:
    """A connection, as ``pymysql.connect(**settings)`` opens it (see the module docstring)."""
    password = settings.get("password")
    if isinstance(password, str):
        settings = {**settings, "password": password.encode("utf-8")}
    return _Connection(**settings)
