"""Columns and names the source hides or folds: INVISIBLE columns, and table names on a
server with ``lower_case_table_names=1``.

Plain ``tidemark run``s against a private MariaDB; after each, the lake equals the source
row for row, the column that ``SELECT *`` leaves out included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.pipeline.context import table_dir
from tests.conftest import (
    HAVE_MARIADB,
    assert_lake_equals_source,
    fresh_database,
    load_pipeline,
)

pytestmark = pytest.mark.integration


def test_invisible_column_reaches_the_lake(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    db = "cols_invisible"
    fresh_database(
        mariadb,
        db,
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), secret INT INVISIBLE)",
        "INSERT INTO t (id, v, secret) SELECT seq, CONCAT('v', seq), seq * 7 FROM seq_1_to_2500",
    )
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{db}.t", "where": "secret IS NOT NULL"}],
        name=db,
        defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    manifest = json.loads(
        (Path(table_dir(config, f"{db}.t")) / "_tidemark" / "current.json").read_text()
    )
    assert [c["name"] for c in manifest["columns"]] == ["id", "v", "secret"]
    # (the filter, true for every row, names the invisible column: the read's derived table must
    # have it); a binlog change of the invisible column is applied too
    mariadb.execute(
        "UPDATE t SET secret = secret + 1 WHERE id <= 10",
        "INSERT INTO t (id, v, secret) VALUES (3000, 'late', 42)",
        database=db,
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    assert_lake_equals_source(config, mariadb, [f"{db}.t"])


@pytest.fixture(scope="module")
def folding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    """A private MariaDB with ``lower_case_table_names=1``: names are stored and logged lower
    case."""
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed (Debian package mariadb-server)")
    server = LocalMariaDB.create(
        {**GOOD_BINLOG, "lower-case-table-names": "1"}, base_dir=tmp_path_factory.mktemp("folding")
    )
    server.start()
    yield server
    server.destroy()


def test_mixed_case_config_name_on_a_folding_server(
    folding: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """The config spells the table ``Lct_Shop.Orders``; the server stores and logs
    ``lct_shop.orders``. Snapshot, then row changes and statements spelling the name a third way:
    every run matches the binlog's names to the configured table, and the lake equals the source."""
    assert folding.execute("SELECT @@lower_case_table_names") == [(1,)]
    fresh_database(
        folding,
        "Lct_Shop",
        "CREATE TABLE Orders (id INT PRIMARY KEY, v VARCHAR(20))",
        "INSERT INTO Orders SELECT seq, CONCAT('v', seq) FROM seq_1_to_3000",
    )
    name = "Lct_Shop.Orders"
    config = load_pipeline(
        tmp_path,
        folding,
        [{"name": name}],
        name="lct",
        defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    assert_lake_equals_source(config, folding, [name])
    first = json.loads((Path(table_dir(config, name)) / "_tidemark" / "current.json").read_text())
    folding.execute(
        "UPDATE ORDERS SET v = 'changed' WHERE id <= 100",
        "DELETE FROM lct_shop.orders WHERE id BETWEEN 200 AND 299",
        "INSERT INTO Orders VALUES (5000, 'late')",
        database="LCT_SHOP",
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    second = json.loads((Path(table_dir(config, name)) / "_tidemark" / "current.json").read_text())
    assert second["version"] == first["version"] + 1  # the changes were matched, not missed
    assert second["rows"] == 3000 - 100 + 1
    assert_lake_equals_source(config, folding, [name])
    # a statement on the table, spelt in yet another case, is matched too: it is re-read
    folding.execute(
        "TRUNCATE TABLE LCT_SHOP.ORDERS",
        "INSERT INTO Orders VALUES (1, 'after')",
        database="lct_shop",
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    third = json.loads((Path(table_dir(config, name)) / "_tidemark" / "current.json").read_text())
    assert third["rows"] == 1
    assert_lake_equals_source(config, folding, [name])
