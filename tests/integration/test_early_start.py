"""The JVM starts early only when Spark will read (`orchestrator.app.early`): a run whose tables
the driver reads (`orchestrator.pipeline.read.local`, and tables without a key of any size)
starts none, and a table too big for the driver starts it as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.early import Outlook, needs_spark
from orchestrator.config import load_config
from orchestrator.pipeline.read.local import LOCAL_ROWS
from tests.conftest import fresh_database, pipeline_config, write_config
from tests.integration.test_cli_run import tidemark

pytestmark = pytest.mark.integration

STARTED = "spark session started"


@pytest.fixture(scope="module")
def tables(mariadb: LocalMariaDB) -> LocalMariaDB:
    """``early_db.small`` (100 rows), ``early_db.tiny`` (empty), ``early_db.big`` (above the
    driver's limit)."""
    fresh_database(
        mariadb,
        "early_db",
        "CREATE TABLE small (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO small SELECT seq, CONCAT('v', seq) FROM seq_1_to_100",
        "CREATE TABLE tiny (id INT PRIMARY KEY)",
        "CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(10))",
        f"INSERT INTO big SELECT seq, 'x' FROM seq_1_to_{LOCAL_ROWS + 5000}",
        "ANALYZE TABLE small, tiny, big",
    )
    return mariadb


def _config(server: LocalMariaDB, tmp_path: Path, entries: list[str], name: str) -> Path:
    return write_config(
        tmp_path / f"{name}.yaml",
        pipeline_config(tmp_path, server, [{"name": e} for e in entries], name=name),
    )


def test_spark_is_needed_only_for_a_table_above_the_drivers_limit(
    tables: LocalMariaDB, tmp_path: Path
) -> None:
    small = load_config(_config(tables, tmp_path, ["early_db.small", "early_db.tiny"], "e1"))
    pattern = load_config(_config(tables, tmp_path, ["early_db.*"], "e2"))
    nothing = Outlook(reads=True, published=frozenset(), resuming=False)
    assert not needs_spark(small, False, nothing)
    assert needs_spark(pattern, False, nothing)  # the pattern takes big
    big_published = Outlook(reads=True, published=frozenset({"early_db.big"}), resuming=False)
    assert not needs_spark(
        pattern, False, big_published
    )  # big is incremental: read from the binlog
    assert needs_spark(pattern, True, big_published)  # unless snapshotted again
    assert needs_spark(small, False, Outlook(reads=True, published=frozenset(), resuming=True))
    missing = load_config(_config(tables, tmp_path, ["early_db.small", "early_db.not_there"], "e3"))
    assert needs_spark(missing, False, nothing)  # unknown to the listing: assume it is big


def test_a_big_table_without_a_key_needs_no_spark(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """The driver reads a table without a key whole (`orchestrator.pipeline.read.keyless`),
    whatever its size."""
    fresh_database(
        mariadb,
        "early_heap",
        "CREATE TABLE heap (a INT, v VARCHAR(10))",
        f"INSERT INTO heap SELECT seq % 7, 'x' FROM seq_1_to_{LOCAL_ROWS + 5000}",
        "ANALYZE TABLE heap",
    )
    config = load_config(_config(mariadb, tmp_path, ["early_heap.heap"], "e4"))
    assert not needs_spark(
        config, False, Outlook(reads=True, published=frozenset(), resuming=False)
    )


def test_a_run_of_small_tables_starts_no_jvm(tables: LocalMariaDB, tmp_path: Path) -> None:
    path = _config(tables, tmp_path, ["early_db.small", "early_db.tiny"], "small_only")
    run = tidemark("run", "--config", str(path), "--no-progress")
    assert run.returncode == 0, run.stderr[-2000:]
    output = run.stdout + run.stderr
    assert STARTED not in output
    assert (
        "read 1 small table(s) in the driver: 100 rows" in output
    )  # the empty table has no chunk to read
    lake = Path(load_config(path).output.path)
    assert (
        json.loads((lake / "early_db" / "small" / "_tidemark" / "current.json").read_text())["rows"]
        == 100
    )
    assert (
        json.loads((lake / "early_db" / "tiny" / "_tidemark" / "current.json").read_text())["rows"]
        == 0
    )


def test_a_table_above_the_drivers_limit_is_read_by_spark(
    tables: LocalMariaDB, tmp_path: Path
) -> None:
    path = _config(tables, tmp_path, ["early_db.big", "early_db.small"], "with_big")
    run = tidemark("run", "--config", str(path), "--no-progress")
    assert run.returncode == 0, run.stderr[-2000:]
    output = run.stdout + run.stderr
    assert STARTED in output and "read 1 small table(s) in the driver: 100 rows" in output
    lake = Path(load_config(path).output.path)
    manifest = json.loads((lake / "early_db" / "big" / "_tidemark" / "current.json").read_text())
    assert manifest["rows"] == LOCAL_ROWS + 5000
