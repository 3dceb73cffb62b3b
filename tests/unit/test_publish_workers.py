"""Publish's worker processes (`orchestrator.pipeline.publish.workers`), with a stand-in for a
table's publish: what the run gets back from its workers, and what stops them."""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog

from orchestrator.config import PipelineConfig, parse_config
from orchestrator.errors import RunFailed
from orchestrator.pipeline import workers
from orchestrator.pipeline.failed import table_failure
from orchestrator.pipeline.publish import workers as publish_workers
from orchestrator.positions import BinlogPosition
from orchestrator.state.store import RunTableRecord, TableCheckpoint

TABLES = [f"db.t{i}" for i in range(6)]

if workers.worker_count(len(TABLES)) == 1:
    pytest.skip("one core: no workers", allow_module_level=True)


def config_for(tmp_path: Path) -> PipelineConfig:
    return parse_config(
        {
            "pipeline": "p",
            "source": {"host": "h", "user": "u", "server_id": 1},
            "output": {"path": str(tmp_path / "lake")},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "tables": [{"name": "db.*"}],
        },
        check_env=False,
    )


def todo(tables: list[str] = TABLES) -> list[tuple[RunTableRecord, BinlogPosition]]:
    return [
        (
            RunTableRecord("run-1", t, "snapshot", "reconciled", None, ["id"], {}, None, None),
            BinlogPosition("binlog.000001", 4 + i),
        )
        for i, t in enumerate(tables)
    ]


PublishOne = Callable[
    [PipelineConfig, Callable[[], None], str, RunTableRecord, BinlogPosition, Catalog | None],
    tuple[TableCheckpoint, bool],
]


@dataclass(frozen=True)
class grouped:  # used as a function: a group's publish made of ``one``
    """A group's publish made of ``one`` for each table: each table's exception in its place
    (a class: the workers get it pickled)."""

    one: PublishOne

    def __call__(
        self,
        config: PipelineConfig,
        guard: Callable[[], None],
        run_id: str,
        group: Sequence[tuple[RunTableRecord, BinlogPosition]],
        catalog: Catalog | None,
    ) -> list[tuple[TableCheckpoint, bool] | Exception]:
        out: list[tuple[TableCheckpoint, bool] | Exception] = []
        for record, high in group:
            try:
                out.append(self.one(config, guard, run_id, record, high, catalog))
            except Exception as exc:
                out.append(exc)
        return out


def one_table(
    config: PipelineConfig,
    guard: Callable[[], None],
    run_id: str,
    record: RunTableRecord,
    high: BinlogPosition,
    catalog: Catalog | None,
) -> tuple[TableCheckpoint, bool]:
    """Publishes nothing: logs, then fails or dies as the table's name says."""
    guard()
    if record.table == "db.t1" and os.environ.get("TEST_DISK_FULL"):
        raise OSError(28, "No space left on device")
    time.sleep(0.2)  # every worker gets tables
    logging.getLogger("tidemark.test").info(
        "table %s published by pid %d", record.table, os.getpid()
    )
    if record.table == "db.t2":
        raise RunFailed("table db.t2: its own trouble")
    if record.table == "db.t4" and os.environ.get("TEST_WORKER_DIES"):
        os.kill(os.getpid(), signal.SIGKILL)
    return TableCheckpoint(
        config.pipeline, record.table, 1, high.to_json(), 10, "m", run_id, dt.datetime.now(dt.UTC)
    ), True


stand_in = grouped(one_table)


def test_outcomes_come_back_with_their_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    outcomes = {
        o.table: o
        for o in publish_workers.publish_each(
            config_for(tmp_path), "run-1", todo(), stand_in, lambda: None
        )
    }
    assert set(outcomes) == set(TABLES)
    assert (
        outcomes["db.t2"].checkpoint is None
        and outcomes["db.t2"].reason == "table db.t2: its own trouble"
    )
    for record, high in todo():
        if record.table != "db.t2":
            checkpoint = outcomes[record.table].checkpoint
            assert checkpoint is not None and checkpoint.position == high.to_json()
    pids = {
        int(r.getMessage().rsplit(" ", 1)[1]) for r in caplog.records if r.name == "tidemark.test"
    }
    assert len(pids) >= 2 and os.getpid() not in pids, "workers, not the run itself, published them"
    logged = {r.getMessage().split()[1] for r in caplog.records if r.name == "tidemark.test"}
    assert logged == set(TABLES), "every worker's log line reached the run's log"


def test_a_worker_killed_from_outside_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_WORKER_DIES", "1")
    with pytest.raises(RunFailed, match="a publish worker process died"):
        list(
            publish_workers.publish_each(
                config_for(tmp_path), "run-1", todo(), stand_in, lambda: None
            )
        )


def test_the_run_losing_its_lock_stops_the_workers(tmp_path: Path) -> None:
    class Lost(Exception):
        pass

    def guard() -> None:
        raise Lost("lost the lock")

    seen = []
    with pytest.raises(Lost):
        for outcome in publish_workers.publish_each(
            config_for(tmp_path), "run-1", todo(), stand_in, guard
        ):
            seen.append(outcome)
    assert seen == [], "the run checks its lock before it takes any worker's outcome"


def test_an_error_that_fails_the_run_lets_the_tables_in_hand_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_DISK_FULL", "1")
    tables = [f"db.t{i}" for i in range(30)]
    seen = []
    with pytest.raises(OSError) as failed:
        for outcome in publish_workers.publish_each(
            config_for(tmp_path), "run-1", todo(tables), stand_in, lambda: None
        ):
            seen.append(outcome.table)
    assert failed.value.errno == 28 and failed.value.__cause__ is None, (
        "raised as the worker raised it"
    )
    assert seen and "db.t1" not in seen, (
        "the tables other workers had in hand were finished and handed over"
    )
    assert "db.t0" in seen, "so was the table published in the same group as the failing one"
    # The groups already handed to the pool (running, or in its call queue: at most twice the
    # workers and one) still end; the rest are cancelled. How many had started by the time the
    # run saw the failure depends on the machine's load (one run in twelve saw 11 of 15 groups
    # started), so only the last two groups are certain never to start.
    groups = workers.groups(tables, workers.worker_count(len(tables)))
    never = {table for group in groups[-2:] for table in group}
    assert not never & set(seen), f"tables not started yet were not started: {seen}"


@pytest.mark.parametrize("released", [True, False])
def test_a_table_whose_sqlite_file_stayed_locked_is_published_again(
    tmp_path: Path, released: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite's busy timeout running out (a catalog commit that lost the file to other writers) is
    tried again; a file that stays locked fails the run (a rerun resumes), not the table."""
    db = tmp_path / "catalog.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (a)")
    holder.execute("BEGIN IMMEDIATE")  # another process's write transaction
    tries: list[int] = []

    def one(
        config: PipelineConfig,
        guard: Callable[[], None],
        run_id: str,
        record: RunTableRecord,
        high: BinlogPosition,
        catalog: Catalog | None,
    ) -> tuple[TableCheckpoint, bool]:
        tries.append(1)
        if released and len(tries) == 2:
            holder.execute("ROLLBACK")
        conn = sqlite3.connect(db, timeout=0.05)
        try:
            with conn:
                conn.execute("INSERT INTO t VALUES (1)")
        finally:
            conn.close()
        return TableCheckpoint(
            config.pipeline,
            record.table,
            1,
            high.to_json(),
            1,
            "m",
            run_id,
            dt.datetime.now(dt.UTC),
        ), True

    publish = publish_workers.publish_each(
        config_for(tmp_path), "run-1", todo(["db.t0"]), grouped(one), lambda: None, workers=False
    )
    try:
        if released:
            [outcome] = list(publish)
            assert outcome.checkpoint is not None and len(tries) == 2
            assert (
                "table db.t0: the SQLite file of the state store or catalog stayed locked "
                "(database is locked); publishing it again (try 2 of 3)" in caplog.text
            )
            assert holder.execute("SELECT COUNT(*) FROM t").fetchone() == (1,)
        else:
            with pytest.raises(sqlite3.OperationalError, match="database is locked") as failed:
                list(publish)
            assert len(tries) == publish_workers.LOCKED_ATTEMPTS
            assert table_failure(failed.value) is None, "the run fails, not the table"
    finally:
        holder.close()


def write_row(
    config: PipelineConfig,
    guard: Callable[[], None],
    run_id: str,
    record: RunTableRecord,
    high: BinlogPosition,
    catalog: Catalog | None,
) -> tuple[TableCheckpoint, bool]:
    """Writes a row into the SQLite file ``record.info["db"]`` names, as a table's publish writes
    the catalog's and the state store's file."""
    conn = sqlite3.connect(record.info["db"], timeout=2)
    try:
        with conn:
            conn.execute("INSERT INTO t VALUES (?)", (record.table,))
    finally:
        conn.close()
    return TableCheckpoint(
        config.pipeline, record.table, 1, high.to_json(), 1, "m", run_id, dt.datetime.now(dt.UTC)
    ), True


def test_workers_are_not_forked_inside_the_heartbeats_transaction(tmp_path: Path) -> None:
    """The lease's heartbeat renews in a transaction of its own thread, holding `faults.QUIET`. A
    worker forked meanwhile would copy SQLite's record that this process holds the file's write
    lock, and find it locked for good (a run failed so: "stayed locked past the busy timeout");
    the workers are forked once the renewal is over."""
    import threading

    from orchestrator.services import faults

    db = tmp_path / "shared.db"
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (name TEXT)")
    setup.close()
    inside, done = threading.Event(), threading.Event()

    def renewal() -> None:  # as `lease.Lease.renew`: its SQLite work inside QUIET
        with faults.QUIET:
            conn = sqlite3.connect(db, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES ('heartbeat')")
            inside.set()
            time.sleep(0.5)
            conn.execute("COMMIT")
            conn.close()
        done.set()

    heartbeat = threading.Thread(target=renewal)
    heartbeat.start()
    assert inside.wait(10)
    records = [
        (
            RunTableRecord(
                "run-1", t, "snapshot", "reconciled", None, ["id"], {"db": str(db)}, None, None
            ),
            BinlogPosition("binlog.000001", 4 + i),
        )
        for i, t in enumerate(TABLES)
    ]
    outcomes = list(
        publish_workers.publish_each(
            config_for(tmp_path), "run-1", records, grouped(write_row), lambda: None
        )
    )
    heartbeat.join()
    assert done.is_set()
    assert [(o.table, o.error, o.reason) for o in sorted(outcomes, key=lambda o: o.table)] == [
        (t, None, None) for t in TABLES
    ]
    check = sqlite3.connect(db)
    assert sorted(r[0] for r in check.execute("SELECT name FROM t")) == sorted(
        [*TABLES, "heartbeat"]
    )
    check.close()


def _report_may_fork(out: Any) -> None:
    out.put(workers.may_fork_workers())


def test_a_daemonic_process_publishes_without_workers() -> None:
    """A Celery worker's task runs in a daemonic process, where `multiprocessing` refuses to
    start children ("daemonic processes are not allowed to have children"): publish then keeps
    the tables in the process instead of failing."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_report_may_fork, args=(out,), daemon=True)
    child.start()
    child.join(30)
    assert out.get(timeout=5) is False
    assert workers.may_fork_workers() is True


@pytest.mark.parametrize(
    ("output", "publish", "reconcile"),
    [
        ({"path": "lake"}, 2, 1),
        ({"path": "s3://b/lake"}, 4, 4),
        ({"path": "lake", "staging": "s3a://b/staging"}, 4, 4),
    ],
    ids=["local", "lake on S3", "staging on S3"],
)
def test_more_workers_per_core_where_files_are_on_an_object_store(
    tmp_path: Path, output: dict[str, str], publish: int, reconcile: int
) -> None:
    """On an object store a worker mostly waits for requests: more of them use the cores."""
    if not output["path"].startswith("s3"):
        output = {**output, "path": str(tmp_path / output["path"])}
    config = parse_config(
        {
            "pipeline": "p",
            "source": {"host": "h", "user": "u", "server_id": 1},
            "output": output,
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "tables": [{"name": "db.*"}],
        },
        check_env=False,
    )
    assert workers.per_core(config, workers.PER_CORE) == publish
    assert workers.per_core(config, 1) == reconcile
    assert workers.worker_count(200, workers.per_core(config, 1)) == min(
        reconcile * len(os.sched_getaffinity(0)), workers.MAX_WORKERS
    )
