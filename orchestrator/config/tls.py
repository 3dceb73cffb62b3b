"""``source.tls``, read and checked (docs/source.md, "TLS"; docs/config.md).

A mode of `TLS_MODES`; ``ca``, the CA certificates a verifying mode trusts; ``cert`` and
``key``, the client certificate a server that asks for one (``REQUIRE X509``) is shown, only
beside a mode that takes TLS for sure: under ``preferred`` a server that offers no TLS would
see the login without it, under ``disabled`` never with it.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

from orchestrator.config.sections import (
    TLS_MODES,
    TLS_VERIFYING,
    Reader,
    TlsConfig,
    section_keys,
)

#: Connector/J settings that say whether and how TLS is checked: ``source.tls.mode`` sets them
#: (`orchestrator.source.tls`), so they are refused beside a mode other than ``preferred``.
#: Where the CA and the client's key store are (``serverSslCert``, ``trustCertificateKeyStore*``,
#: ``keyStore*``, ``clientCertificateKeyStore*``) may be given: on a cluster, their paths on the
#: executors.
TLS_PARAMS = frozenset(
    {
        "usessl",
        "sslmode",
        "trustservercertificate",
        "disablesslhostnameverification",
        "requiressl",
        "verifyservercertificate",
    }
)
#: The modes a client certificate may go with: TLS or no connection.
CERTAIN = ("required", *TLS_VERIFYING)


def tls_section(r: Reader, data: Any, params: Iterable[Any], check_env: bool) -> TlsConfig:
    """``source.tls``: a known mode; a CA file only with a mode that verifies; a client
    certificate and its key together, with a mode of `CERTAIN`; when ``check_env``, files that
    Python's ``ssl`` loads. ``params``: ``source.jdbc_url_params``'s keys, none of `TLS_PARAMS`
    beside a mode other than ``preferred``."""
    if data is None:
        return TlsConfig()
    m = r.mapping(data, "source.tls", section_keys(TlsConfig), set())
    mode = r.setting(
        m,
        "source.tls.mode",
        TlsConfig,
        str,
        lambda v: (
            None if v in TLS_MODES else f"expected one of {', '.join(TLS_MODES)}, found {v!r}"
        ),
    )
    ca = r.value(m, "ca", "source.tls.ca", str)
    cert = r.value(m, "cert", "source.tls.cert", str)
    key = r.value(m, "key", "source.tls.key", str)
    if ca is not None and mode not in TLS_VERIFYING:
        r.problem(
            "source.tls.ca",
            f"is used only to verify the certificate; set source.tls.mode to "
            f"{' or '.join(TLS_VERIFYING)}, or remove it",
        )
    elif ca is not None and check_env:
        try:
            ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            r.problem(
                "source.tls.ca",
                f"cannot load CA certificates from {ca} ({exc}); give a PEM file of them",
            )
    if (cert is None) != (key is None):
        given, missing = ("cert", "key") if key is None else ("key", "cert")
        r.problem(
            f"source.tls.{given}",
            f"goes with source.tls.{missing}: give the PEM files of both the client certificate "
            "and its private key",
        )
    elif cert is not None and mode not in CERTAIN:
        r.problem(
            "source.tls.cert",
            f"is shown over TLS only, which source.tls.mode {mode} does not insist on; set "
            f"source.tls.mode to {', '.join(CERTAIN)}",
        )
    elif cert is not None and key is not None and check_env:
        problem = client_certificate_problem(cert, key)
        if problem:
            r.problem("source.tls.cert", problem)
    if mode != "preferred":
        for name in params:
            if str(name).lower() in TLS_PARAMS:
                r.problem(
                    f"source.jdbc_url_params.{name}",
                    f"is set from source.tls.mode ({mode}), which every source connection "
                    "follows; remove it",
                )
    return TlsConfig(mode=mode if mode in TLS_MODES else "preferred", ca=ca, cert=cert, key=key)


def _no_password() -> bytes:
    raise ValueError("the key is encrypted")


def load_client_certificate(context: ssl.SSLContext, cert: str, key: str) -> None:
    """``context`` shows the certificate ``cert`` with its key ``key`` (PEM files); a
    `ValueError` naming the problem if it cannot: a key with a passphrase is refused, never
    asked for on the terminal."""
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except ValueError as exc:
        raise ValueError(
            f"the private key {key} has a passphrase; give it without one "
            f"(openssl pkey -in {key} -out <new file>), readable by Tidemark's user only"
        ) from exc
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot load the client certificate {cert} with the key {key} ({exc}); give PEM "
            "files of a certificate and of its own private key"
        ) from exc


def client_certificate_problem(cert: str, key: str) -> str | None:
    """What is wrong with the client certificate ``cert`` and key ``key``, or None."""
    try:
        load_client_certificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key)
    except ValueError as exc:
        return str(exc)
    return None
