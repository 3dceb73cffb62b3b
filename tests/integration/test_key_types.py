"""Key columns whose published type could merge rows: a TINYINT(1) is published as a boolean
(docs/types.md), but a TINYINT(1) of the primary key or of a unique NOT NULL key holds -128..127,
and as booleans keys 1 and 2 would be one row. Such a column is published as TINYINT (int8).

Plain runs against a private MariaDB: a snapshot read by Spark (several chunks) and by the
driver (one chunk), then row changes, key changes included; after each run the lake equals
the source row for row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.pipeline.context import table_dir
from tests.conftest import assert_lake_equals_source, fresh_database, load_pipeline

pytestmark = pytest.mark.integration

DB = "key_types"
TABLES = [f"{DB}.single", f"{DB}.pair", f"{DB}.small"]


def arrow_types(config: object, table: str) -> dict[str, str]:
    manifest = json.loads(
        (Path(table_dir(config, table)) / "_tidemark" / "current.json").read_text()
    )
    return {c["name"]: c["arrow_type"] for c in manifest["columns"]}


def test_a_tinyint1_key_keeps_its_values(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    fresh_database(
        mariadb,
        DB,
        "CREATE TABLE single (id TINYINT(1) NOT NULL PRIMARY KEY, flag TINYINT(1) NOT NULL, v INT)",
        "INSERT INTO single SELECT CAST(seq AS SIGNED) - 100, seq % 2, seq FROM seq_0_to_220",
        "CREATE TABLE pair (kind TINYINT(1) NOT NULL, n INT NOT NULL, v INT,"
        " PRIMARY KEY (kind, n))",
        "INSERT INTO pair SELECT seq % 4, seq, seq * 3 FROM seq_1_to_400",
        "CREATE TABLE small (id INT NOT NULL PRIMARY KEY, code TINYINT(1) NOT NULL,"
        " UNIQUE KEY (code))",
        "INSERT INTO small VALUES (1, 0), (2, 1), (3, 2), (4, -3)",
    )
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": t} for t in TABLES],
        name=DB,
        defaults={"chunk_size": 50, "batch_chunks": 4, "read_margin_seconds": 0.0},
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    assert_lake_equals_source(config, mariadb, TABLES)
    # a key's TINYINT(1) is an integer, any other stays a boolean
    assert {k: arrow_types(config, f"{DB}.single")[k] for k in ("id", "flag")} == {
        "id": "int8",
        "flag": "bool",
    }
    assert arrow_types(config, f"{DB}.pair")["kind"] == "int8"
    assert arrow_types(config, f"{DB}.small")["code"] == "int8"

    mariadb.execute(
        "UPDATE single SET v = v + 1000, flag = 1 - flag WHERE id BETWEEN -10 AND 10",
        "DELETE FROM single WHERE id IN (2, 3, 4)",
        "UPDATE single SET id = 121 WHERE id = 120",  # a key change
        "INSERT INTO pair VALUES (5, 1, 1), (-7, 2, 2)",
        "UPDATE pair SET kind = 6 WHERE kind = 3 AND n < 40",
        "UPDATE small SET code = 9 WHERE id = 3",
        database=DB,
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    assert_lake_equals_source(config, mariadb, TABLES)


def test_a_table_published_with_a_boolean_key_is_read_again() -> None:
    """A table an earlier release published with its TINYINT(1) key as a boolean (its keys
    merged) does not take changes onto those files: the published types differ from what the
    run would write, so it is read again."""
    from orchestrator.pipeline.plan.tables import _same_shape
    from orchestrator.schema.tables import ColumnInfo, TableInfo, mark_keys

    columns = (
        ColumnInfo("id", "tinyint", "tinyint(1)", False),
        ColumnInfo("v", "int", "int(11)", True),
    )
    info = TableInfo(DB, "t", mark_keys(columns, [("id",)]), ("id",), (), 0)
    manifest = {
        "version": 3,
        "columns": [
            {"name": "id", "mysql_type": "tinyint(1)", "arrow_type": "bool"},
            {"name": "v", "mysql_type": "int(11)", "arrow_type": "int32"},
        ],
    }
    assert not _same_shape(f"{DB}.t", manifest, info)  # type: ignore[arg-type]
    manifest["columns"][0]["arrow_type"] = "int8"
    assert _same_shape(f"{DB}.t", manifest, info)  # type: ignore[arg-type]
