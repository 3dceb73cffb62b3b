"""How every connection to the source takes TLS: ``source.tls`` (docs/source.md, "TLS").

The modes are the MySQL client's ``--ssl-mode``:

- ``preferred`` (the default): TLS when the server offers it, its certificate not checked;
- ``required``: TLS, or no connection; the certificate not checked;
- ``verify_ca``: required, and the certificate signed by a CA of ``source.tls.ca`` (without
  it, one the system trusts: Python's default CAs for the run's own connections, Java's for
  the Spark reads);
- ``verify_identity``: verify_ca, and the certificate names ``source.host``;
- ``disabled``: never TLS.

The run's own connections (pymysql: the source, the binlog) get an ``ssl.SSLContext`` built
once a process (`pymysql_settings`); given a context, pymysql refuses a server that offers no
TLS. The Spark reads get each driver's settings (`jdbc_settings`): MariaDB's Connector/J 2
(``useSsl``, ``trustServerCertificate``, ``serverSslCert``, ``disableSslHostnameVerification``)
and 3 and 4 (``sslMode``) at once, each ignoring the other's; MySQL's ``sslMode``, with the CA in
a trust store of its own (`_trust_store`): it reads no PEM file.

A client certificate (``source.tls.cert`` and ``key``, for a user created ``REQUIRE X509``) is
loaded into the pymysql context, and put in a PKCS12 key store for both Connector/Js
(`_key_store`).
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from orchestrator.config import SourceConfig, TlsConfig
from orchestrator.config.sections import TLS_VERIFYING
from orchestrator.config.tls import load_client_certificate
from orchestrator.errors import ConfigError
from orchestrator.source.check import Check
from orchestrator.source.dialect import MARIADB_DRIVER, MYSQL_DRIVER

#: Each driver's settings for TLS without a certificate check: MariaDB's Connector/J 2
#: (``useSsl``, ``trustServerCertificate``) and 3 and 4 (``sslMode``), MySQL's.
_UNCHECKED = {
    MARIADB_DRIVER: {"useSsl": "true", "trustServerCertificate": "true", "sslMode": "trust"},
    MYSQL_DRIVER: {"sslMode": "REQUIRED"},
}


def unverified() -> ssl.SSLContext:
    """The context pymysql builds for a connection without TLS options (its PREFERRED mode), but
    for the CA certificates it loads and never consults: the protocol, options and verify flags
    of ``ssl.create_default_context()``, no certificate or host name check."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    context.options |= ssl.OP_NO_SSLv2 | ssl.OP_NO_SSLv3
    return context


def pymysql_settings(tls: TlsConfig) -> dict[str, object]:
    """``pymysql.connect``'s TLS arguments for ``tls``: none for ``preferred`` (pymysql's own
    mode, `orchestrator.source.connect`), else a context pymysql requires TLS with."""
    if tls.mode == "preferred":
        return {}
    if tls.mode == "disabled":
        return {"ssl_disabled": True}
    client = (tls.cert, tls.key, _modified(tls.cert) + _modified(tls.key))
    return {"ssl": _context(tls.mode, tls.ca, _modified(tls.ca), *client)}


def _modified(path: str | None) -> float:
    """A file's modification time: a file replaced (a rotated CA or client certificate) is
    loaded again."""
    try:
        return os.stat(path).st_mtime if path else 0.0
    except OSError:
        return 0.0  # loading it names the problem


@functools.lru_cache(maxsize=8)
def _context(
    mode: str,
    ca: str | None,
    _mtime: float,
    cert: str | None = None,
    key: str | None = None,
    _client_mtime: float = 0.0,
) -> ssl.SSLContext:
    if mode not in TLS_VERIFYING:
        context = unverified()
    else:
        try:
            context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"source.tls.ca: cannot load CA certificates from {ca} ({exc}); "
                "give a PEM file of them"
            ) from exc
        context.check_hostname = mode == "verify_identity"
        # As pymysql's: a server's own self-signed CA (MySQL makes one) often misses the key
        # usage that Python 3.13's strict flag asks of a CA.
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    if cert and key:
        try:
            load_client_certificate(context, cert, key)
        except ValueError as exc:
            raise ConfigError(f"source.tls.cert: {exc}") from exc
    return context


#: The session's TLS, for `tls_check`.
TLS_STATUS = "SHOW SESSION STATUS WHERE Variable_name IN ('Ssl_version', 'Ssl_cipher')"


def tls_check(config: SourceConfig, status: dict[str, str]) -> Check:
    """`doctor`'s line of what the connection it made has: TLS and its version, and what
    checked the certificate; ``status``: the session's ``Ssl_version`` and ``Ssl_cipher``. It
    passes: a connection ``source.tls`` does not allow is refused before (`login`)."""
    tls = config.tls
    if not status.get("Ssl_cipher"):
        why = "the server offers none" if tls.mode == "preferred" else "source.tls.mode disabled"
        return Check("TLS", True, f"none: {why}; the connections are not encrypted")
    if tls.mode in TLS_VERIFYING:
        against = f"the CA file {tls.ca}" if tls.ca else "the system's CA certificates"
        name = f", and names {config.host}" if tls.mode == "verify_identity" else ""
        checked = f"its certificate checked against {against}{name}"
    else:
        checked = f"its certificate not checked (source.tls.mode {tls.mode})"
    if tls.cert:
        checked += f"; the client certificate {tls.cert} shown"
    return Check("TLS", True, f"{status.get('Ssl_version')} ({status['Ssl_cipher']}), {checked}")


def jdbc_settings(tls: TlsConfig, driver: str, offered: Callable[[], bool]) -> dict[str, str]:
    """The Connector/J URL settings for ``tls``; ``offered`` says whether the source offers TLS
    (asked only in ``preferred`` mode: the reads then ask for it, as pymysql's connections do).
    With a client certificate, the key store that shows it (`_client_settings`)."""
    settings = _server_settings(tls, driver, offered)
    if tls.cert and tls.key:
        settings.update(_client_settings(tls.cert, tls.key, driver))
    return settings


def _server_settings(tls: TlsConfig, driver: str, offered: Callable[[], bool]) -> dict[str, str]:
    mysql = driver == MYSQL_DRIVER
    if tls.mode == "disabled":
        return {"sslMode": "DISABLED"} if mysql else {}
    if tls.mode == "preferred":
        return dict(_UNCHECKED[driver]) if offered() else {}
    if tls.mode == "required":
        return dict(_UNCHECKED[driver])
    identity = tls.mode == "verify_identity"
    if mysql:
        settings = {"sslMode": "VERIFY_IDENTITY" if identity else "VERIFY_CA"}
        if tls.ca:
            settings["trustCertificateKeyStoreUrl"] = _trust_store(tls.ca, _modified(tls.ca))
            settings["trustCertificateKeyStoreType"] = "PKCS12"
        return settings
    settings = {
        "useSsl": "true",
        "trustServerCertificate": "false",
        "disableSslHostnameVerification": "false" if identity else "true",
        "sslMode": "verify-full" if identity else "verify-ca",
    }
    if tls.ca:
        settings["serverSslCert"] = tls.ca
    return settings


def _client_settings(cert: str, key: str, driver: str) -> dict[str, str]:
    """Each driver's settings for the PKCS12 key store of the client certificate: MariaDB's
    Connector/J (2 to 4) takes a path, MySQL's a URL."""
    path, password = _key_store(cert, key, _modified(cert) + _modified(key))
    if driver == MYSQL_DRIVER:
        return {
            "clientCertificateKeyStoreUrl": path.as_uri(),
            "clientCertificateKeyStoreType": "PKCS12",
            "clientCertificateKeyStorePassword": password,
        }
    return {"keyStore": str(path), "keyStoreType": "PKCS12", "keyStorePassword": password}


_store_lock = threading.Lock()
_store_dir: str | None = None


def _kept(data: bytes, prefix: str) -> Path:
    """``data`` in a new file of this process's store directory (its user's only, removed at
    the process's exit)."""
    global _store_dir
    with _store_lock:
        if _store_dir is None:
            _store_dir = tempfile.mkdtemp(prefix="tidemark-tls-")
            atexit.register(shutil.rmtree, _store_dir, True)
        path = Path(_store_dir) / f"{prefix}-{len(os.listdir(_store_dir))}.p12"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return path


@functools.lru_cache(maxsize=8)
def _key_store(cert: str, key: str, _mtime: float) -> tuple[Path, str]:
    """A PKCS12 key store of the client certificate ``cert`` (and any chain after it in the
    file) and its private key ``key``, and the store's password: Java's PKCS12 store keeps a
    key only encrypted, so the key is, under a password made for this process. The password
    guards no more than the PEM key file beside it does; it is in the JDBC URL, which Spark
    redacts from plans and its UI (``spark.sql.redaction.options.regex``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        BestAvailableEncryption,
        load_pem_private_key,
        pkcs12,
    )

    try:
        chain = x509.load_pem_x509_certificates(Path(cert).read_bytes())
        private = load_pem_private_key(Path(key).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"source.tls.cert: cannot make a key store of {cert} and {key} ({exc}); give PEM "
            "files of a certificate and of its private key, without a passphrase"
        ) from exc
    password = secrets.token_urlsafe(24)
    store = pkcs12.serialize_key_and_certificates(
        b"client",
        private,  # type: ignore[arg-type]
        chain[0],
        chain[1:] or None,
        BestAvailableEncryption(password.encode()),
    )
    return _kept(store, "client"), password


@functools.lru_cache(maxsize=8)
def _trust_store(ca: str, _mtime: float) -> str:
    """A ``file:`` URL of a PKCS12 trust store holding the CA certificates of the PEM file
    ``ca``, for MySQL's Connector/J; in a directory of this process, removed at its exit.

    Java takes a certificate of a PKCS12 store as trusted only with the attribute
    `cryptography` writes for a Java trust store; the store has no password (it holds no
    secret). `cryptography` is imported here: few runs need it."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import NoEncryption, pkcs12

    try:
        certificates = x509.load_pem_x509_certificates(Path(ca).read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"source.tls.ca: cannot load CA certificates from {ca} ({exc}); give a PEM file of them"
        ) from exc
    store = pkcs12.serialize_java_truststore(
        [pkcs12.PKCS12Certificate(c, f"ca{i}".encode()) for i, c in enumerate(certificates)],
        NoEncryption(),
    )
    return _kept(store, "ca").as_uri()
