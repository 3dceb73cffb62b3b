"""A source reached at an IPv6 address (``source.host: "[::1]"``, brackets taken off): the
run's own connections take it as it is; the Spark reads' JDBC URL must write it in brackets
(``jdbc:mysql://[::1]:3306/``), and every chunk read failed before ("error parsing url :
Incorrect port value"), while tables read by the driver were published. A private MariaDB
listening on 127.0.0.1 and ::1; a snapshot read by Spark and by the driver, then a change
applied from the binlog."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from orchestrator.pipeline.read.local import LOCAL_ROWS
from tests.conftest import assert_lake_equals_source, chunked_config
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def dual_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    work = tmp_path_factory.mktemp("ipv6")
    server = LocalMariaDB.create({**GOOD_BINLOG, "bind-address": "127.0.0.1,::1"}, base_dir=work)
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def test_a_source_at_an_ipv6_address_is_read_by_spark_and_kept(
    dual_stack: LocalMariaDB, tmp_path: Path
) -> None:
    dual_stack.execute("CREATE USER tm@'::1' IDENTIFIED BY 'pw'", "GRANT ALL ON *.* TO tm@'::1'")
    dual_stack.execute("CREATE DATABASE v6")
    dual_stack.execute(
        "CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(20))",
        f"INSERT INTO big SELECT seq, CONCAT('v', seq) FROM seq_1_to_{LOCAL_ROWS + 2000}",
        "CREATE TABLE small (id INT PRIMARY KEY, v INT)",
        "INSERT INTO small VALUES (1, 1), (2, 2)",
        "ANALYZE TABLE big",
        database="v6",
    )
    tables = ["v6.big", "v6.small"]
    source = {**dual_stack.source_config(), "host": "[::1]", "user": "tm", "password": "pw"}
    config = chunked_config(tmp_path, dual_stack, tables, source=source)

    snapshot = tidemark(config)
    assert snapshot.returncode == 0, snapshot.stderr[-3000:]
    assert "table v6.big: snapshot, 3 chunks" in snapshot.stdout + snapshot.stderr
    assert_lake_equals_source(config, dual_stack, tables)
    dual_stack.execute(
        "UPDATE big SET v = 'changed' WHERE id % 1000 = 0", "DELETE FROM small", database="v6"
    )
    assert tidemark(config).returncode == 0
    assert_lake_equals_source(config, dual_stack, tables)
