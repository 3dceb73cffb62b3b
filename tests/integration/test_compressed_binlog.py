"""A MariaDB writing compressed binlog events (``log_bin_compress=ON``): plain ``tidemark
run``s under concurrent writes keep the lake equal to the source, both decoders read the
compressed rows events alike, and a compressed statement-format change is re-read.

The server is private (started with ``--log-bin-compress=ON`` and the smallest
``--log-bin-compress-min-len``, so nearly every rows event is compressed); MySQL's
TRANSACTION_PAYLOAD has unit tests (tests/unit/test_compressed.py): no MySQL runs here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from orchestrator.app.run import run_command
from tests.conftest import (
    HAVE_MARIADB,
    assert_lake_equals_source,
    fresh_database,
    load_pipeline,
)
from tests.integration.test_binlog import (
    TYPES_DDL,
    TYPES_ROWS,
    TYPES_UPDATE,
    position,
)
from tests.integration.test_binlog_fast import assert_identical, capture_both, run_sql
from tests.integration.test_consistency import load_tables, run_under_writers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def compressing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    """A private MariaDB compressing every binlog event it can."""
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed (Debian package mariadb-server)")
    server = LocalMariaDB.create(
        {**GOOD_BINLOG, "log-bin-compress": "ON", "log-bin-compress-min-len": "10"},
        base_dir=tmp_path_factory.mktemp("compressing"),
    )
    server.start()
    yield server
    server.destroy()


def compressed_events(server: LocalMariaDB) -> dict[str, int]:
    """How many events of each compressed kind the server's binlogs hold."""
    counts: dict[str, int] = {}
    for log_file in server.execute("SHOW BINARY LOGS"):
        for row in server.execute(f"SHOW BINLOG EVENTS IN '{log_file[0]}'"):
            if "compressed" in str(row[2]).lower():
                counts[str(row[2])] = counts.get(str(row[2]), 0) + 1
    return counts


def test_runs_under_concurrent_writes_equal_the_source(
    compressing: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = "zshop"
    tables = load_tables(compressing, db, orders=2000, typed_rows=800, seed=3)
    config = load_pipeline(
        tmp_path,
        compressing,
        [{"name": t} for t in tables],
        name="zshop",
        defaults={"chunk_size": 500, "batch_chunks": 3, "read_margin_seconds": 0.05},
    )

    def run() -> None:
        assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0

    run_under_writers(compressing, db, typed_rows=800, pause=0.001, run=run)  # the snapshot
    run()
    assert_lake_equals_source(config, compressing, tables)
    run_under_writers(compressing, db, typed_rows=800 + 10_000, pause=0.001, run=run)  # incremental
    # A statement-format change comes as a compressed QUERY: the table is re-read.
    compressing.execute(
        "SET SESSION binlog_format = 'STATEMENT'",
        "UPDATE all_types SET t_varchar = 'changed by a long enough statement' WHERE id % 5 = 1",
        database=db,
    )
    caplog.set_level(logging.INFO)
    caplog.clear()
    run()
    assert_lake_equals_source(config, compressing, tables)
    assert any(
        r.getMessage().startswith(
            f"table {db}.all_types: a statement-format change `UPDATE all_types SET t_varchar"
        )
        and " at binlog." in r.getMessage()
        for r in caplog.records
    )
    kinds = compressed_events(compressing)
    assert kinds.get("Query_compressed", 0) > 0, kinds
    for kind in (
        "Write_rows_compressed_v1",
        "Update_rows_compressed_v1",
        "Delete_rows_compressed_v1",
    ):
        assert kinds.get(kind, 0) > 100, kinds


def test_both_decoders_read_compressed_rows_alike(
    compressing: LocalMariaDB, tmp_path: Path
) -> None:
    """Every type of the mapping through compressed rows events: the fast decoder and
    python-mysql-replication's (fed the inflated events) write the same segments."""
    ddl = TYPES_DDL.replace("cap_types.", "ztypes.")
    fresh_database(compressing, "ztypes", ddl)
    start = position(compressing)
    run_sql(
        compressing,
        "ztypes",
        *[f"INSERT INTO ztypes.t VALUES {row}" for row in TYPES_ROWS],
        TYPES_UPDATE.replace("cap_types.", "ztypes."),
        "UPDATE ztypes.t SET id = id + 100 WHERE id IN (2, 3)",
        "DELETE FROM ztypes.t WHERE id IN (1, 4)",
    )
    stop = position(compressing)
    library, fast = capture_both(tmp_path, compressing, "ztypes.t", ("id",), start, stop)
    assert_identical(library, fast)
    assert set(fast.column("_tm_op").to_pylist()) == {"I", "U", "D"}
