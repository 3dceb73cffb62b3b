"""A source that requires TLS (``require_secure_transport=ON``, as Azure's MySQL does by default):
every connection of a run takes TLS when the server offers it, the Spark reads too, with
MariaDB's Connector/J and with MySQL's, whose reading of every column family is the server's.

Before, the run's own connections took TLS (pymysql's PREFERRED mode) but MariaDB's Connector/J
asked for none, so every chunk read of a table too big for the driver was refused, reported as
a lost connection ("check that the source is up"). MySQL's Connector/J, which .ci/setup fetches,
read no chunk at all: it URL-decodes the URL's values, and took ``time_zone='+00:00'`` for
``' 00:00'``. A private MariaDB with a certificate made here (a CA of its own, `cryptography`); a
snapshot read by Spark and by the driver, then a change applied from the binlog."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from orchestrator.app.doctor import run_checks
from orchestrator.binlog.stream import binlog_end
from orchestrator.config import DEFAULT_JDBC_JAR, PipelineConfig, SourceConfig, TlsConfig
from orchestrator.errors import SourceNotReady
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.services.jars import MARIADB_CONNECTOR_J, MYSQL_CONNECTOR_J, jar_path
from orchestrator.source.connection import Source
from orchestrator.source.dialect import MYSQL_DRIVER
from orchestrator.source.tls import jdbc_settings
from tests.conftest import assert_lake_equals_source, chunked_config, load_pipeline
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DB = "tm_tls"


def _certificates(directory: Path) -> dict[str, str]:
    """A CA, a server certificate it signed (for the name localhost, not for 127.0.0.1) and a
    client certificate it signed (RSA, its key in PKCS#1 as MySQL makes one), with their keys,
    and another CA, as PEM files."""
    now = dt.datetime.now(dt.UTC)

    def certificate(subject: str, key: Any, issuer: x509.Name, signer: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName("localhost")]),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    # as mysql_ssl_rsa_setup and MySQL's auto_generate_certs make a client's: RSA, PKCS#1 PEM
    client_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidemark test CA")])
    ca = certificate("tidemark test CA", ca_key, ca_name, ca_key, True)
    server = certificate("localhost", server_key, ca_name, ca_key, False)
    client = certificate("tidemark", client_key, ca_name, ca_key, False)
    other_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another CA")])
    other = certificate("another CA", server_key, other_name, server_key, True)
    files = {
        "other-ca": other.public_bytes(serialization.Encoding.PEM),
        "ssl-ca": ca.public_bytes(serialization.Encoding.PEM),
        "ssl-cert": server.public_bytes(serialization.Encoding.PEM),
        "ssl-key": server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
        "client-cert": client.public_bytes(serialization.Encoding.PEM),
        "client-key": client_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
    }
    paths = {}
    for option, data in files.items():
        path = directory / f"{option}.pem"
        path.write_bytes(data)
        paths[option] = str(path)
    return paths


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    work = tmp_path_factory.mktemp("tls")
    settings: dict[str, str | None] = {
        **GOOD_BINLOG,
        **_certificates(work),
        "require-secure-transport": "ON",
    }
    for beside in ("other-ca", "client-cert", "client-key"):  # beside ssl-ca: `_ca`
        del settings[beside]
    server = LocalMariaDB.create(settings, base_dir=work)
    server.start()
    try:
        yield server
    finally:
        server.destroy()


#: Debian's MariaDB Connector/J 2.7, MariaDB's 4 and MySQL's, each read with in a process of its
#: own (`tidemark`).
EACH_DRIVER = pytest.mark.parametrize(
    "jar",
    [DEFAULT_JDBC_JAR, jar_path(MARIADB_CONNECTOR_J), jar_path(MYSQL_CONNECTOR_J)],
    ids=["mariadb", "mariadb-4", "mysql"],
)


def _driver(jar: str) -> str:
    """A name for the driver in ``jar``, for a database of its own."""
    return {jar_path(MYSQL_CONNECTOR_J): "mysql", jar_path(MARIADB_CONNECTOR_J): "mariadb_4"}.get(
        jar, "mariadb"
    )


def _ca(server: LocalMariaDB, which: str = "ssl-ca") -> str:
    """The PEM file of the CA that signed the server's certificate, or of ``other-ca``,
    ``client-cert`` or ``client-key``."""
    return str(Path(str(server.settings["ssl-ca"])).with_name(f"{which}.pem"))


#: Columns of every family the Spark read maps, beside the key: each driver's reading is checked
#: against the server's (`assert_lake_equals_source`, the verify oracle).
COLUMNS = (
    "u BIGINT UNSIGNED, d DECIMAL(30, 10), f FLOAT, g DOUBLE, b TINYINT(1), y YEAR,"
    " dt DATETIME(6), ts TIMESTAMP(3) NULL, t TIME(6), day DATE, e ENUM('a', 'b'),"
    " s SET('x', 'y'), j JSON, bl BLOB, bits BIT(10), txt VARCHAR(40) CHARACTER SET utf8mb4"
)
VALUES = (
    "seq * 1000003, seq / 7, seq / 3, seq / 11, seq % 2, 1901 + seq % 255,"
    " TIMESTAMP '2024-01-01 00:00:00' + INTERVAL seq SECOND + INTERVAL seq % 1000 MICROSECOND,"
    " TIMESTAMP '2024-06-01 12:00:00.123',"
    " SEC_TO_TIME(CAST(seq % 3000 AS SIGNED) - 1500) + INTERVAL 5 MICROSECOND,"
    " DATE '2000-01-01' + INTERVAL seq % 9000 DAY, IF(seq % 3 = 0, 'b', 'a'),"
    " IF(seq % 2 = 0, 'x,y', 'y'), JSON_OBJECT('n', seq), UNHEX(HEX(seq)), seq % 1024,"
    " CONCAT('é', seq, '😀')"
)


@EACH_DRIVER
def test_a_source_that_requires_tls_is_read_over_tls(
    tls_server: LocalMariaDB, tmp_path: Path, jar: str
) -> None:
    """Each run is a `tidemark run` process, whose Spark session is started with the config's
    driver jar (this process's session, if any, holds MariaDB's only)."""
    assert tls_server.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")[0][1], "no TLS here"
    db = f"{DB}_{_driver(jar)}"
    tls_server.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    tls_server.execute(
        f"CREATE TABLE big (id INT PRIMARY KEY, {COLUMNS})",
        f"INSERT INTO big SELECT seq, {VALUES} FROM seq_1_to_{LOCAL_ROWS + 2000}",
        "INSERT INTO big (id) VALUES (0)",  # a row of NULLs
        "CREATE TABLE small (id INT PRIMARY KEY, v INT)",
        "INSERT INTO small SELECT seq, seq FROM seq_1_to_10",
        "ANALYZE TABLE big",
        database=db,
    )
    tables = [f"{db}.big", f"{db}.small"]
    source = {**tls_server.source_config(), "jdbc_driver_jar": jar, "time_zone": "+02:00"}
    config = chunked_config(tmp_path, tls_server, tables, name=db, source=source)

    snapshot = tidemark(config)
    assert snapshot.returncode == 0, snapshot.stderr[-3000:]
    assert f"table {db}.big: snapshot, 3 chunks" in snapshot.stdout + snapshot.stderr
    assert_lake_equals_source(config, tls_server, tables)
    tls_server.execute(
        "UPDATE big SET txt = 'changed', d = -d WHERE id % 1000 = 0",
        "DELETE FROM small WHERE id > 8",
        database=db,
    )
    assert tidemark(config).returncode == 0
    assert_lake_equals_source(config, tls_server, tables)


def _big_and_small(server: LocalMariaDB, db: str) -> str:
    """Database ``db`` made anew with ``big``, Spark's to read (a few chunks), and ``small``,
    the driver's; its name."""
    server.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    server.execute(
        "CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(12, 2))",
        f"INSERT INTO big SELECT seq, CONCAT('v', seq), seq / 4 FROM seq_1_to_{LOCAL_ROWS + 2000}",
        "CREATE TABLE small (id INT PRIMARY KEY, v INT)",
        "INSERT INTO small SELECT seq, seq FROM seq_1_to_10",
        "ANALYZE TABLE big",
        database=db,
    )
    return db


def _checked_config(
    path: Path, server: LocalMariaDB, db: str, jar: str, host: str, **source: Any
) -> Path:
    return chunked_config(
        path,
        server,
        [f"{db}.big", f"{db}.small"],
        db,
        source={**server.source_config(), "host": host, "jdbc_driver_jar": jar, **source},
    )


@EACH_DRIVER
def test_source_tls_verify_identity_checks_the_certificate_on_every_connection(
    tls_server: LocalMariaDB, tmp_path: Path, jar: str
) -> None:
    """``source.tls.mode: verify_identity`` with the CA that signed the server's certificate,
    which names localhost only: reached as 127.0.0.1 the run stops before any read, naming the
    fix; the Spark reads check the certificate too (given another CA through
    ``jdbc_url_params`` they fail the run, which a rerun resumes); reached as localhost the
    snapshot, Spark reads included, and a binlog change are published equal to the source."""
    mysql = jar == jar_path(MYSQL_CONNECTOR_J)
    db = _big_and_small(tls_server, f"{DB}_verify_{_driver(jar)}")
    tls = {"mode": "verify_identity", "ca": _ca(tls_server)}

    by_address = tidemark(_checked_config(tmp_path, tls_server, db, jar, "127.0.0.1", tls=tls))
    assert by_address.returncode == 3, by_address.stderr[-2000:]
    assert "its TLS certificate does not name source.host (127.0.0.1)" in by_address.stderr

    other = _ca(tls_server, "other-ca")
    wrong_for_spark = (
        {
            "trustCertificateKeyStoreUrl": jdbc_settings(
                TlsConfig("verify_ca", other), MYSQL_DRIVER, lambda: True
            )["trustCertificateKeyStoreUrl"]
        }
        if mysql
        else {"serverSslCert": other}
    )
    config = _checked_config(
        tmp_path, tls_server, db, jar, "localhost", tls=tls, jdbc_url_params=wrong_for_spark
    )
    spark_refused = tidemark(config)
    assert spark_refused.returncode == 1, spark_refused.stderr[-2000:]
    assert "the TLS certificate of the source" in spark_refused.stderr
    assert "failed the check source.tls asks for" in spark_refused.stderr

    config = _checked_config(tmp_path, tls_server, db, jar, "localhost", tls=tls)
    resumed = tidemark(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming the unfinished run" in resumed.stdout + resumed.stderr
    tables = [f"{db}.big", f"{db}.small"]
    assert_lake_equals_source(config, tls_server, tables)
    tls_server.execute(
        "UPDATE big SET v = 'changed' WHERE id % 1000 = 0", "DELETE FROM small", database=db
    )
    assert tidemark(config).returncode == 0
    assert_lake_equals_source(config, tls_server, tables)


def test_source_tls_modes_refuse_a_connection_they_do_not_allow(
    tls_server: LocalMariaDB, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Each mode's refusal names the cause and the fix, for the source and binlog connections:
    ``required`` of a server that offers no TLS, ``verify_ca`` of a certificate another CA
    signed, ``disabled`` at a server that requires TLS; ``verify_ca`` with the right CA
    connects by address (it does not check the name)."""
    assert not mariadb.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")[0][1], "TLS here"

    def pipeline(server: LocalMariaDB, **tls: str) -> PipelineConfig:
        return load_pipeline(
            tmp_path, server, [{"name": "a.b"}], source={**server.source_config(), "tls": tls}
        )

    def source(server: LocalMariaDB, **tls: str) -> SourceConfig:
        return pipeline(server, **tls).source

    def tls_line(config: PipelineConfig) -> str:
        (line,) = [c for c in run_checks(config) if c.name == "TLS"]
        assert line.ok
        return line.detail

    def refusal(config: SourceConfig) -> tuple[str, str]:
        with pytest.raises(SourceNotReady) as by_source, Source(config, "") as connection:
            connection.query("SELECT 1")
        with pytest.raises(pymysql.err.OperationalError) as by_binlog:
            binlog_end(config, "", 5)
        return str(by_source.value), str(by_binlog.value)

    plain, binlog = refusal(source(mariadb, mode="required"))
    assert "the server offers no TLS, which source.tls.mode required requires" in plain
    assert "doesn't support" in binlog
    signed_elsewhere = source(tls_server, mode="verify_ca", ca=_ca(tls_server, "other-ca"))
    plain, binlog = refusal(signed_elsewhere)
    assert "its TLS certificate failed the check source.tls.mode verify_ca" in plain
    assert f"against the CA file {_ca(tls_server, 'other-ca')}" in plain
    assert "CERTIFICATE_VERIFY_FAILED" in binlog
    plain, _ = refusal(source(tls_server, mode="disabled"))
    assert "access denied" in plain and "requires TLS" in plain
    assert "source.tls.mode is disabled" in plain

    checked = source(tls_server, mode="verify_ca", ca=_ca(tls_server))
    with Source(checked, "") as connection:
        assert connection.query("SHOW SESSION STATUS LIKE 'Ssl_cipher'")[0][1]
    assert binlog_end(checked, "", 5)[1] > 0
    said = tls_line(pipeline(tls_server, mode="verify_ca", ca=_ca(tls_server)))  # doctor's line
    assert said.startswith("TLSv1.") and f"checked against the CA file {_ca(tls_server)}" in said
    assert "not checked (source.tls.mode preferred)" in tls_line(pipeline(tls_server))
    assert tls_line(pipeline(mariadb)).startswith("none: the server offers none")
    client = {"cert": _ca(tls_server, "client-cert"), "key": _ca(tls_server, "client-key")}
    shown = tls_line(pipeline(tls_server, mode="required", **client))
    assert shown.endswith(
        f"not checked (source.tls.mode required); the client certificate {client['cert']} shown"
    )


@EACH_DRIVER
def test_a_user_that_must_show_a_client_certificate_is_read_with_it(
    tls_server: LocalMariaDB, tmp_path: Path, jar: str
) -> None:
    """A user created ``REQUIRE X509``: without ``source.tls.cert`` the run stops before any
    read, naming it; with the client certificate and its key every connection shows it (the
    Spark reads from a PKCS12 key store made of the PEM files): a snapshot read by Spark and
    by the driver, then a change from the binlog, published equal to the source. The key
    store's password is in no output."""
    db = _big_and_small(tls_server, f"{DB}_x509_{_driver(jar)}")
    tls_server.execute(
        "CREATE USER IF NOT EXISTS tm_x509@'%' IDENTIFIED BY 'pw' REQUIRE X509",
        "GRANT SELECT, RELOAD, REPLICATION CLIENT, REPLICATION SLAVE ON *.* TO tm_x509@'%'",
    )
    login = {"user": "tm_x509", "password": "pw"}

    without = tidemark(
        _checked_config(
            tmp_path, tls_server, db, jar, "localhost", tls={"mode": "required"}, **login
        )
    )
    assert without.returncode == 3, without.stderr[-2000:]
    assert "as user `tm_x509`: access denied" in without.stderr
    assert "give it in source.tls.cert and source.tls.key" in without.stderr

    tls = {
        "mode": "verify_identity",
        "ca": _ca(tls_server),
        "cert": _ca(tls_server, "client-cert"),
        "key": _ca(tls_server, "client-key"),
    }
    config = _checked_config(tmp_path, tls_server, db, jar, "localhost", tls=tls, **login)
    snapshot = tidemark(config)
    assert snapshot.returncode == 0, snapshot.stderr[-3000:]
    assert f"table {db}.big: snapshot, 3 chunks" in snapshot.stdout + snapshot.stderr
    tables = [f"{db}.big", f"{db}.small"]
    assert_lake_equals_source(config, tls_server, tables)
    tls_server.execute(
        "UPDATE big SET v = 'changed' WHERE id % 1000 = 0", "DELETE FROM small", database=db
    )
    change = tidemark(config)
    assert change.returncode == 0, change.stderr[-3000:]
    assert_lake_equals_source(config, tls_server, tables)
    said = "".join(r.stdout + r.stderr for r in (snapshot, change))
    said += "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.log"))
    assert "StorePassword" not in said
