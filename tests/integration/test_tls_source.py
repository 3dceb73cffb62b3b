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
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from orchestrator.config import DEFAULT_JDBC_JAR
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.services.jars import MYSQL_CONNECTOR_J, jar_path
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DB = "tm_tls"


def _certificates(directory: Path) -> dict[str, str]:
    """A CA and a server certificate it signed (for 127.0.0.1 and localhost), as PEM files."""
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
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidemark test CA")])
    ca = certificate("tidemark test CA", ca_key, ca_name, ca_key, True)
    server = certificate("localhost", server_key, ca_name, ca_key, False)
    files = {
        "ssl-ca": ca.public_bytes(serialization.Encoding.PEM),
        "ssl-cert": server.public_bytes(serialization.Encoding.PEM),
        "ssl-key": server_key.private_bytes(
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
    server = LocalMariaDB.create(settings, base_dir=work)
    server.start()
    try:
        yield server
    finally:
        server.destroy()


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


@pytest.mark.parametrize(
    "jar", [DEFAULT_JDBC_JAR, jar_path(MYSQL_CONNECTOR_J)], ids=["mariadb", "mysql"]
)
def test_a_source_that_requires_tls_is_read_over_tls(
    tls_server: LocalMariaDB, tmp_path: Path, jar: str
) -> None:
    """Each run is a `tidemark run` process, whose Spark session is started with the config's
    driver jar (this process's session, if any, holds MariaDB's only)."""
    assert tls_server.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")[0][1], "no TLS here"
    db = f"{DB}_{Path(jar).name.split('-')[0]}"
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
    config = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            tls_server,
            [{"name": t} for t in tables],
            name=db,
            source=source,
            defaults={"chunk_size": 20000, "batch_chunks": 2, "read_margin_seconds": 0.0},
        ),
    )

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
