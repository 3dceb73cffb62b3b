"""A state store on MariaDB (``mysql+pymysql://``), holding the default SQL catalog too: a MySQL
shop's store. The store's own API runs on it in tests/unit (test_state.py, test_lease.py); here
a pipeline's snapshot and changes are published through it, and `status --json` and `reset
--purge-output` read and clear it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.app.status import reset_command, status_report
from orchestrator.config import load_config
from tests.conftest import assert_lake_equals_source, chunked_config, fresh_database

pytestmark = [pytest.mark.integration]

DB = "tm_mariadb_state"


def test_a_pipeline_whose_state_store_and_catalog_are_on_mariadb(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    store = f"tm_store_{uuid.uuid4().hex[:10]}"
    mariadb.execute(f"CREATE DATABASE {store}")
    tables = [f"{DB}.big", f"{DB}.small"]
    fresh_database(
        mariadb,
        DB,
        "CREATE TABLE big (id INT PRIMARY KEY, v INT)",
        "INSERT INTO big SELECT seq, seq FROM seq_1_to_60000",
        "CREATE TABLE small (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO small SELECT seq, seq FROM seq_1_to_300",
        "ANALYZE TABLE big",
    )
    url = f"mysql+pymysql://root@127.0.0.1:{mariadb.port}/{store}"
    config = load_config(chunked_config(tmp_path, mariadb, tables, DB, state={"url": url}))
    for change in range(3):
        if change:
            mariadb.execute(
                f"UPDATE big SET v = -v WHERE id % 9 = {change}",
                f"DELETE FROM small WHERE id = {change}",
                database=DB,
            )
        assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
        assert_lake_equals_source(config, mariadb, tables)
    engine = create_engine(url)
    try:
        assert "iceberg_tables" in inspect(engine).get_table_names()  # the catalog's, there
    finally:
        engine.dispose()
    report = status_report(config)
    assert [(p["table"], p["version"]) for p in report["published"]] == [
        (f"{DB}.big", 3),
        (f"{DB}.small", 3),
    ]
    assert reset_command(config, tables=[], purge_output=True, unlock=False, yes=True) == 0
    assert status_report(config)["published"] == []
