"""A random mix of writes, applied by runs exactly (docs/design.md).

`tests.workload` writes a seeded mix of what a source sees on seventeen tables: row and key
changes (case-only changes of a case-insensitive text key among them), STATEMENT and MIXED
sessions, MINIMAL and NOBLOB row images, TRUNCATE, columns added, dropped, renamed and retyped,
a primary key dropped and added again, a table swapped by RENAME, foreign-key cascades two levels
down, multi-table updates and deletes, triggers and a stored procedure, savepoints, and XA
transactions prepared across a run. After each run every table of the lake equals its source,
through the manifest; at the end through pyiceberg and DuckDB too.

The same mix runs as long as asked, with runs killed at random, in tests/stress.py, which is not
part of the suite. ``TIDEMARK_WORKLOAD_SEED`` picks another seed for both tests here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import PipelineConfig
from orchestrator.pipeline.failed import TablesFailed
from tests import workload
from tests.conftest import assert_lake_equals_source, load_pipeline, s3_output
from tests.iceberg_readers import assert_readers_equal_source
from tests.integration.conftest import run_plain
from tests.integration.test_resume import tidemark
from tests.services import MotoS3

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("TIDEMARK_WORKLOAD_SEED", "20261201"))
#: Rounds of writes and a run; writes a round.
ROUNDS, WRITES = 6, 40


def _pipeline(
    mariadb: LocalMariaDB, tmp_path: Path, database: str, **overrides: Any
) -> PipelineConfig:
    workload.create(mariadb, database)
    return load_pipeline(
        tmp_path,
        mariadb,
        workload.table_entries(database),
        name=database,
        defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
        **overrides,
    )


def _equal(config: PipelineConfig, mariadb: LocalMariaDB, database: str) -> None:
    assert_lake_equals_source(config, mariadb, [f"{database}.{t}" for t in workload.TABLES])


def test_random_writes_between_runs_are_applied_exactly(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Writes between runs, an XA transaction sometimes left prepared across one: every run
    succeeds, and the lake equals the source after each."""
    config = _pipeline(mariadb, tmp_path, "wl_between")
    _between_runs(mariadb, config, "wl_between", SEED, ROUNDS, lambda: run_plain(config))


def test_random_writes_between_runs_on_an_object_store(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    s3_server: MotoS3,
    s3_bucket: str,
    pg_state: tuple[str, str],
) -> None:
    """The same on a cloud's layout: staging and lake on an S3 endpoint (moto's server), the
    state store and Iceberg catalog on PostgreSQL; the readers read the tables from S3. Runs
    are ``tidemark run`` processes, whose Spark session carries the S3 connector (the test
    session's shared one, which a run in this process would take, does not)."""
    database = "wl_s3"
    config = _pipeline(
        mariadb,
        tmp_path,
        database,
        output=s3_output(s3_server, s3_bucket),
        state={"url": pg_state[0]},
    )

    def run() -> None:
        done = tidemark(config.path)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])

    _between_runs(mariadb, config, database, SEED + 2, ROUNDS - 2, run)
    assert not (tmp_path / "lake").exists()


def _between_runs(
    mariadb: LocalMariaDB,
    config: PipelineConfig,
    database: str,
    seed: int,
    rounds: int,
    run: Callable[[], None],
) -> None:
    """``rounds`` rounds of writes and a ``run`` (which checks it succeeded), the lake equal to
    the source after each; then a quiet run, and the Iceberg readers equal to the source."""
    load = workload.Workload(seed, database)
    run()
    conn = load.connect(mariadb)
    try:
        for _ in range(rounds):
            load.write(conn, WRITES)
            load.turn_xa(mariadb)
            run()
            _equal(config, mariadb, database)
    finally:
        conn.close()
        load.end_xa(mariadb)
    run()
    assert_readers_equal_source(config, [f"{database}.{t}" for t in workload.TABLES])


def test_random_writes_during_runs_are_applied_exactly(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A writer thread changing every table while each run reads and captures, then a run with
    the source quiet: the lake equals the source. A run under the writer may fail tables on
    their own (one that changed again during each of its re-reads: the writer makes a DDL every
    few hundred milliseconds; one whose column was dropped while it was read); the quiet run
    publishes them."""
    database = "wl_during"
    config = _pipeline(mariadb, tmp_path, database)
    load = workload.Workload(SEED + 1, database)
    conn = load.connect(mariadb)
    try:
        for round_ in range(ROUNDS - 2):
            writer = workload.Writer(mariadb, database, SEED * 100 + round_, pause=0.01)
            writer.start()
            try:
                run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False)
            except TablesFailed:
                pass  # those tables alone; the run after publishes them
            finally:
                writer.stop()
            run_plain(config)
            _equal(config, mariadb, database)
            load.write(conn, WRITES // 4)
    finally:
        conn.close()
        load.end_xa(mariadb)
