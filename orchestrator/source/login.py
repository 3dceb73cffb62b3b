"""One line saying why connecting to the source failed, and what to change; never the password."""

from __future__ import annotations

import re

import pymysql

from orchestrator.config import SourceConfig
from orchestrator.source.retry import error_code

#: pymysql's error for a server that offers no TLS to a connection that requires it.
_TLS_REFUSED = 2026
#: ER_TOO_MANY_USER_CONNECTIONS: the account's MAX_USER_CONNECTIONS are all in use.
_USER_CONNECTIONS = 1226


def _password_source(cfg: SourceConfig) -> str:
    if cfg.password_env is not None:
        return f"source.password_env {cfg.password_env}"
    if cfg.password is not None:
        return "source.password in the config"
    if cfg.airflow_conn_id is not None:
        return f"Airflow connection `{cfg.airflow_conn_id}`"
    return "none is configured: set source.password_env"


_REASON = re.compile(r"\((.*)\)\s*$")


def login_problem(cfg: SourceConfig, exc: pymysql.err.MySQLError) -> str:
    """One line saying why connecting failed and what to check; never the password.

    Args:
        cfg: the source config (host, port, user, where the password comes from).
        exc: the PyMySQL error from ``connect``.
    """
    where = f"MySQL at {cfg.host}:{cfg.port}"
    code = error_code(exc)
    message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    if code == 1045:
        return (
            f"cannot log in to {where} as user `{cfg.user}`: access denied; "
            f"check source.user and the password ({_password_source(cfg)})" + _denied_hint(cfg)
        )
    if code == 1130:
        return (
            f"cannot log in to {where} as user `{cfg.user}`: the server does not allow this "
            f"user from this machine; create the user for this client host (e.g. '{cfg.user}'@'%')"
        )
    if code == _USER_CONNECTIONS:
        return (
            f"cannot connect to {where} as user `{cfg.user}`: {message}; the user holds as many "
            "connections as it may at once (MAX_USER_CONNECTIONS): raise it, or stop what "
            "else connects as this user (another run?); `tidemark doctor` says what a run holds"
        )
    if code == _TLS_REFUSED or "SSL" in message:
        return tls_problem(cfg, where, message)
    if code in (2002, 2003):
        match = _REASON.search(message)
        reason = match.group(1) if match else message
        return (
            f"cannot reach {where}: {reason}; check source.host and source.port, that the "
            "server is running and listening on TCP, and that no firewall blocks it"
        )
    if code == 2013:
        return (
            f"cannot connect to {where}: the server dropped the connection during login "
            f"({message}); check source.port points at a MySQL server"
        )
    return (
        f"cannot connect to {where} as user `{cfg.user}`: {message} (error {code}); "
        "check the source section of the config"
    )


def _denied_hint(cfg: SourceConfig) -> str:
    """What else a server says "access denied" for: a connection without TLS where it requires
    one, a user required to show a client certificate (``REQUIRE X509``, ``ISSUER``,
    ``SUBJECT``) that showed none or another."""
    if cfg.tls.mode == "disabled":
        return (
            "; a server that requires TLS (require_secure_transport) refuses a connection "
            "without it in these words: source.tls.mode is disabled"
        )
    if cfg.tls.cert:
        return (
            f"; a user required to show a client certificate of another issuer or subject is "
            f"refused in these words too: check that {cfg.tls.cert} is the one the user requires "
            "(SHOW GRANTS)"
        )
    if cfg.tls.mode != "preferred":  # TLS asked for: the server may want a certificate too
        return (
            "; a user required to show a client certificate (REQUIRE X509, ISSUER or SUBJECT) "
            "is refused in these words too: give it in source.tls.cert and source.tls.key"
        )
    return ""


def tls_problem(cfg: SourceConfig, where: str, message: str) -> str:
    """Why TLS failed as ``source.tls`` asked for it: the server offers none, or its
    certificate failed the check (Python's reason quoted, as ``[SSL: ...] ... (_ssl.c:N)``)."""
    mode = cfg.tls.mode
    if "doesn't support" in message or "not support" in message:
        return (
            f"cannot connect to {where}: the server offers no TLS, which source.tls.mode "
            f"{mode} requires; turn TLS on at the server (ssl_cert, ssl_key), or set "
            "source.tls.mode to preferred"
        )
    match = re.search(r"\[SSL: [^\]]*\] ([^(]*)", message)
    reason = match.group(1).strip() if match else message
    if "mismatch" in reason or "match" in reason.split():
        return (
            f"cannot connect to {where}: its TLS certificate does not name source.host "
            f"({cfg.host}), which source.tls.mode verify_identity asks of it ({reason}); set "
            "source.host to a name the certificate holds, or source.tls.mode to verify_ca"
        )
    if "CERTIFICATE_VERIFY_FAILED" in message:
        ca = f"the CA file {cfg.tls.ca}" if cfg.tls.ca else "the system's CA certificates"
        return (
            f"cannot connect to {where}: its TLS certificate failed the check source.tls.mode "
            f"{mode} asks for against {ca} ({reason}); give the CA that signed it in "
            "source.tls.ca"
        )
    return (
        f"cannot connect to {where}: TLS failed ({reason}, source.tls.mode {mode}); check the "
        "server's TLS settings and source.tls"
    )
