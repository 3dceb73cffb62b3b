"""The state store, run against a real SQLite file and a real PostgreSQL.

Every test runs twice: on a fresh SQLite file, and on a fresh schema of a
database created for this session on a private PostgreSQL cluster the fixtures start
(tests/services.py, user postgres). The PostgreSQL URL carries a password (trust auth ignores it)
so the tests can check it never shows. The lock tests race real processes
(``tests/unit/state_lock_worker.py``). The fixtures are in tests/unit/conftest.py.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, inspect, select, text, update
from sqlalchemy.engine import make_url

from orchestrator.app.demo.localdb import free_port
from orchestrator.errors import RunLocked, StateError
from orchestrator.state import schema as state_schema
from orchestrator.state import store as state
from orchestrator.state.store import ChunkRecord, StateStore, TableCheckpoint
from tests.unit.conftest import PG_SECRET, run_sql

ROOT = Path(__file__).resolve().parents[2]
BIG = 18446744073709551615  # max BIGINT UNSIGNED: more than a signed 64-bit column holds
POS = {"file": "binlog.000003", "pos": 4567, "row": 2, "gtid_set": None}


def chunk(run_id: str, table: str, index: int, batch: int, start: Any, end: Any) -> ChunkRecord:
    return ChunkRecord(
        run_id=run_id,
        table=table,
        index=index,
        batch=batch,
        start=start,
        end=end,
        where=f"`id` >= {index}",
        status="pending",
        low=None,
        high=None,
        rows=None,
        bytes=None,
        path=None,
        attempts=0,
    )


def is_utc(moment: datetime | None) -> bool:
    return moment is not None and moment.utcoffset() == timedelta(0)


# --- schema ------------------------------------------------------------------------


def test_schema_is_created_with_a_version_row(store: StateStore, url: str) -> None:
    rows = run_sql(url, select(state.SCHEMA.c.version))
    assert rows == [(state.code_schema_version(),)]
    engine = create_engine(url)
    try:
        names = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {
        "tm_schema_version",
        "tm_pipelines",
        "tm_runs",
        "tm_run_tables",
        "tm_chunks",
        "tm_capture_checkpoints",
        "tm_table_checkpoints",
        "tm_locks",
    } <= names


def test_newer_schema_is_refused_naming_the_url_without_password(
    store: StateStore, url: str
) -> None:
    store.close()
    code = state.code_schema_version()
    run_sql(url, update(state.SCHEMA).values(version=code + 1))
    with pytest.raises(StateError) as refused:
        StateStore(url)
    message = str(refused.value)
    safe_url = make_url(url).render_as_string(hide_password=True)
    assert message == (
        f"state store at {safe_url} has schema version {code + 1}, newer than "
        f"this Tidemark ({code}); upgrade Tidemark"
    )
    assert PG_SECRET not in message


def test_older_schema_runs_the_migrations(
    store: StateStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.close()
    ran: list[int] = []

    def add_notes_table(conn: Connection) -> None:
        conn.execute(text("CREATE TABLE tm_test_notes (id INTEGER PRIMARY KEY)"))
        ran.append(1)

    code = state.code_schema_version()
    monkeypatch.setattr(
        state_schema, "MIGRATIONS", [*state_schema.MIGRATIONS, add_notes_table]
    )  # where it is read
    StateStore(url).close()
    StateStore(url).close()  # already migrated: nothing runs twice
    assert ran == [1]
    assert run_sql(url, select(state.SCHEMA.c.version)) == [(code + 1,)]
    assert run_sql(url, text("SELECT count(*) FROM tm_test_notes")) == [(0,)]


def test_schema_1_store_gains_the_lease_and_the_segment_owners(store: StateStore, url: str) -> None:
    """A store of schema 1 (before fencing) with a lock and a capture checkpoint is migrated:
    its lock counts with the lease of those days, its segments are the untagged ones."""
    run_id = store.create_run("shop", {}).run_id
    store.save_capture_checkpoint(run_id, POS, 3, 30)
    store.acquire_lock("shop", "old-run")
    store.close()
    run_sql(url, text("ALTER TABLE tm_locks DROP COLUMN lease_seconds"))
    run_sql(url, text("ALTER TABLE tm_capture_checkpoints DROP COLUMN owners"))
    run_sql(url, text("ALTER TABLE tm_chunks DROP COLUMN file_ranges"))  # schema 4's
    run_sql(url, update(state.SCHEMA).values(version=1))
    with StateStore(url) as migrated:
        assert run_sql(url, select(state.SCHEMA.c.version)) == [(state.code_schema_version(),)]
        lock = migrated.lock_info("shop")
        assert lock is not None and lock.lease_seconds == 900
        checkpoint = migrated.capture_checkpoint(run_id)
        assert checkpoint is not None and checkpoint["owners"] == [["", 1]]
        migrated.save_capture_checkpoint(run_id, POS, 4, 40, [["", 1], ["a1b2c3d4", 4]])
        saved = migrated.capture_checkpoint(run_id)
        assert saved is not None and saved["owners"] == [["", 1], ["a1b2c3d4", 4]]


def test_unreachable_store_is_a_state_error_without_password() -> None:
    url = f"postgresql+psycopg://tidemark:{PG_SECRET}@127.0.0.1:{free_port()}/state"
    with pytest.raises(StateError) as failed:
        StateStore(url)
    assert "tidemark:***@127.0.0.1" in str(failed.value)
    assert "unreachable" in str(failed.value)
    assert PG_SECRET not in str(failed.value)


def test_invalid_url_is_a_state_error() -> None:
    with pytest.raises(StateError, match="not a valid SQLAlchemy URL"):
        StateStore("no url at all")


def test_sqlite_store_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateStore(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# --- runs ----------------------------------------------------------------------------


def test_run_round_trip_and_lifecycle(store: StateStore) -> None:
    options = {
        "tables": ["shop.orders", "shop.üñï"],
        "snapshot": True,
        "chunk_size": None,
        "nested": [[1, [BIG, -BIG]], {"a": [None, 1.5, "x'\\\"y"]}],
    }
    before = datetime.now(UTC)
    run = store.create_run("shop", options)
    after = datetime.now(UTC)
    assert run.pipeline == "shop" and run.status == "running"
    assert run.options == options
    assert run.start_position is None and run.high_position is None
    assert run.finished_at is None and run.error is None
    assert is_utc(run.created_at) and before <= run.created_at <= after
    assert store.get_run(run.run_id) == run

    start = {**POS, "pos": BIG, "gtid_set": "0-1-100,1-2-3"}
    store.set_run_positions(run.run_id, start=start)
    store.set_run_positions(run.run_id, high=POS)  # start is kept
    got = store.get_run(run.run_id)
    assert (got.start_position, got.high_position) == (start, POS)
    assert got.updated_at >= run.updated_at

    store.finish_run(run.run_id, "failed", error="read failed: chunk 3")
    failed = store.get_run(run.run_id)
    assert failed.status == "failed" and failed.error == "read failed: chunk 3"
    assert is_utc(failed.finished_at)
    store.finish_run(run.run_id, "running")  # resumed
    resumed = store.get_run(run.run_id)
    assert resumed.status == "running" and resumed.finished_at is None and resumed.error is None


def test_unknown_run_is_a_state_error(store: StateStore) -> None:
    with pytest.raises(StateError, match="run nope is not in the state store"):
        store.get_run("nope")
    with pytest.raises(StateError, match="run nope"):
        store.finish_run("nope", "succeeded")


def test_unfinished_run_is_the_latest_if_not_succeeded(store: StateStore) -> None:
    assert store.unfinished_run("shop") is None
    first = store.create_run("shop", {})
    assert store.unfinished_run("shop") == first
    store.finish_run(first.run_id, "failed", error="boom")
    assert store.unfinished_run("shop") == store.get_run(first.run_id)
    second = store.create_run("shop", {})
    assert store.unfinished_run("shop") == second
    store.finish_run(second.run_id, "succeeded")
    assert store.unfinished_run("shop") is None  # the older failed run was superseded
    assert store.unfinished_run("other") is None
    assert [r.run_id for r in store.runs("shop")] == [second.run_id, first.run_id]
    assert [r.run_id for r in store.runs("shop", limit=1)] == [second.run_id]


# --- tables and chunks -------------------------------------------------------------


def test_run_tables_round_trip_and_status(store: StateStore) -> None:
    run = store.create_run("shop", {})
    info = {"columns": [["id", "bigint unsigned"], ["name", "varchar(20)"]], "max": BIG}
    store.add_run_table(
        run.run_id, "shop.orders", "snapshot", strategy="even", chunk_key=["id"], info=info
    )
    store.add_run_table(
        run.run_id,
        "shop.items",
        "incremental",
        strategy=None,
        chunk_key=["order_id", "line_no"],
        info={"from_position": POS},
    )
    items, orders = store.run_tables(run.run_id)
    assert (orders.table, orders.mode, orders.status, orders.strategy) == (
        "shop.orders",
        "snapshot",
        "planned",
        "even",
    )
    assert orders.chunk_key == ["id"] and orders.info == info
    assert orders.rows is None and orders.version is None
    assert items.chunk_key == ["order_id", "line_no"] and items.info == {"from_position": POS}

    store.set_table_status(
        run.run_id, "shop.orders", "read", rows=BIG // 2, info={"read_seconds": 1.5}
    )
    store.set_table_status(run.run_id, "shop.orders", "published", version=3)
    orders = store.run_tables(run.run_id)[1]
    assert (orders.status, orders.rows, orders.version) == ("published", BIG // 2, 3)
    assert orders.info == {**info, "read_seconds": 1.5}

    # planning the same table again replaces the plan and keeps the status
    store.add_run_table(
        run.run_id, "shop.orders", "snapshot", strategy="uneven", chunk_key=["id"], info={}
    )
    orders = store.run_tables(run.run_id)[1]
    assert (orders.strategy, orders.info, orders.status) == ("uneven", {}, "published")
    with pytest.raises(StateError, match=re.escape("shop.nope is not part of run")):
        store.set_table_status(run.run_id, "shop.nope", "read")


def test_chunks_round_trip_batches_and_marking(store: StateStore) -> None:
    run_id = store.create_run("shop", {}).run_id
    planned = [
        chunk(run_id, "shop.b", 1, 2, [10, "ü'\\"], None),
        chunk(run_id, "shop.b", 0, 2, None, [10, "ü'\\"]),
        chunk(run_id, "shop.a", 2, 1, [[BIG - 1]], [BIG]),
        chunk(run_id, "shop.a", 0, 0, None, [1]),
        chunk(run_id, "shop.a", 1, 0, [1], [[BIG - 1]]),
    ]
    for table in ("shop.a", "shop.b"):
        store.add_run_table(
            run_id,
            table,
            "snapshot",
            strategy="even",
            chunk_key=["id"],
            info={},
            chunks=[c for c in planned if c.table == table],
        )
    everything = store.chunks(run_id)
    assert [(c.table, c.index) for c in everything] == [
        ("shop.a", 0),
        ("shop.a", 1),
        ("shop.a", 2),
        ("shop.b", 0),
        ("shop.b", 1),
    ]
    assert sorted(everything, key=lambda c: (c.table, c.index)) == sorted(
        planned, key=lambda c: (c.table, c.index)
    )
    assert store.batches(run_id) == [0, 1, 2]
    assert [c.index for c in store.chunks(run_id, table="shop.b")] == [0, 1]
    assert [c.index for c in store.chunks(run_id, batch=0)] == [0, 1]

    low = {**POS, "pos": 100}
    store.mark_batch_started(run_id, 0, low)
    store.mark_chunk_done(
        run_id,
        "shop.a",
        0,
        high={**POS, "pos": 200},
        rows=BIG // 4,
        bytes=2048,
        path="file:///staging/run/shop.a/0",
    )
    store.mark_batch_started(run_id, 0, {**POS, "pos": 300})  # retry: only the pending chunk
    done, retried = store.chunks(run_id, batch=0)
    assert (done.status, done.low, done.high, done.rows, done.bytes, done.path, done.attempts) == (
        "done",
        low,
        {**POS, "pos": 200},
        BIG // 4,
        2048,
        "file:///staging/run/shop.a/0",
        1,
    )
    assert (retried.status, retried.low, retried.attempts) == ("pending", {**POS, "pos": 300}, 2)
    assert [c.index for c in store.chunks(run_id, status="done")] == [0]
    assert [(c.table, c.index) for c in store.chunks(run_id, batch=0, status="pending")] == [
        ("shop.a", 1)
    ]
    assert all(c.low is None and c.attempts == 0 for c in store.chunks(run_id, batch=2))

    with pytest.raises(StateError, match=re.escape("no chunk 9 of table shop.a")):
        store.mark_chunk_done(run_id, "shop.a", 9, high=POS, rows=0, bytes=0, path="x")


def test_add_run_table_with_chunks_is_one_transaction(store: StateStore) -> None:
    run_id = store.create_run("shop", {}).run_id
    store.add_run_table(
        run_id,
        "shop.b",
        "snapshot",
        strategy="even",
        chunk_key=["id"],
        info={},
        chunks=[chunk(run_id, "shop.b", i, 0, None, None) for i in range(2)],
    )
    assert [t.table for t in store.run_tables(run_id)] == ["shop.b"]
    assert [(c.table, c.index) for c in store.chunks(run_id)] == [("shop.b", 0), ("shop.b", 1)]

    duplicate = [
        chunk(run_id, "shop.a", 0, 1, None, [5]),
        chunk(run_id, "shop.a", 1, 1, [5], None),
        chunk(run_id, "shop.a", 0, 1, None, [5]),
    ]
    with pytest.raises(StateError, match=re.escape(f"cannot plan shop.a in run {run_id}")):
        store.add_run_table(
            run_id,
            "shop.a",
            "snapshot",
            strategy="even",
            chunk_key=["id"],
            info={},
            chunks=duplicate,
        )
    with pytest.raises(StateError, match="the run does not exist"):  # foreign keys are on
        store.add_run_table(
            "no-such-run",
            "shop.a",
            "snapshot",
            strategy="even",
            chunk_key=["id"],
            info={},
            chunks=[chunk("no-such-run", "shop.a", 0, 0, None, None)],
        )
    assert [t.table for t in store.run_tables(run_id)] == ["shop.b"]  # no shop.a left behind
    assert store.chunks(run_id, table="shop.a") == []
    assert len(store.chunks(run_id)) == 2


def test_status_rows_summarise_the_latest_run(store: StateStore) -> None:
    assert store.status_rows("shop") == []
    run_id = store.create_run("shop", {}).run_id
    store.add_run_table(
        run_id,
        "shop.a",
        "snapshot",
        strategy="even",
        chunk_key=["id"],
        info={},
        chunks=[chunk(run_id, "shop.a", i, 0, None, None) for i in range(3)],
    )
    store.add_run_table(run_id, "shop.b", "incremental", strategy=None, chunk_key=["id"], info={})
    store.mark_chunk_done(run_id, "shop.a", 1, high=POS, rows=70, bytes=1, path="p")
    store.mark_chunk_done(run_id, "shop.a", 2, high=POS, rows=5, bytes=1, path="p")
    a, b = store.status_rows("shop")
    assert (a.run_id, a.run_status, a.table, a.mode, a.status) == (
        run_id,
        "running",
        "shop.a",
        "snapshot",
        "planned",
    )
    assert (a.chunks_done, a.chunks_total, a.rows_read) == (2, 3, 75)
    assert (b.table, b.mode, b.chunks_done, b.chunks_total, b.rows_read) == (
        "shop.b",
        "incremental",
        0,
        0,
        0,
    )
    assert store.status_rows("shop", run_id) == [a, b]


# --- checkpoints ---------------------------------------------------------------------


def test_capture_checkpoint_is_overwritten(store: StateStore) -> None:
    run_id = store.create_run("shop", {}).run_id
    assert store.capture_checkpoint(run_id) is None
    store.save_capture_checkpoint(run_id, POS, segments=1, rows=10)
    later = {**POS, "file": "binlog.000004", "pos": BIG}
    store.save_capture_checkpoint(
        run_id, later, segments=3, rows=BIG // 8, owners=[["a1", 1], ["b2", 3]]
    )
    assert store.capture_checkpoint(run_id) == {
        "position": later,
        "segments": 3,
        "rows": BIG // 8,
        "owners": [["a1", 1], ["b2", 3]],
    }


def test_table_checkpoints_round_trip(store: StateStore) -> None:
    run_id = store.create_run("shop", {}).run_id
    assert store.table_checkpoint("shop", "shop.orders") is None
    published = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    v1 = TableCheckpoint(
        "shop", "shop.orders", 1, POS, 10, "file:///lake/v1.json", run_id, published
    )
    items = TableCheckpoint(
        "shop",
        "shop.items",
        1,
        POS,
        0,
        "s3a://b/items/v1.json",
        run_id,
        published.astimezone(timezone(timedelta(hours=2))),
    )
    store.save_table_checkpoint(v1)
    store.save_table_checkpoint(items)
    v2 = TableCheckpoint(
        "shop",
        "shop.orders",
        2,
        {**POS, "pos": BIG},
        BIG // 2,
        "file:///lake/v2.json",
        run_id,
        published + timedelta(hours=1),
    )
    store.save_table_checkpoint(v2)
    assert store.table_checkpoint("shop", "shop.orders") == v2
    got_items = store.table_checkpoint("shop", "shop.items")
    assert got_items == items and is_utc(got_items.published_at if got_items else None)
    assert store.table_checkpoints("shop") == [items, v2]
    assert store.table_checkpoints("other") == []
    assert store.published_versions("shop") == {"shop.items": 1, "shop.orders": 2}
    assert store.published_versions("other") == {}
    with pytest.raises(ValueError, match="no time zone"):
        store.save_table_checkpoint(
            TableCheckpoint("shop", "t", 1, POS, 0, "m", run_id, datetime(2024, 1, 1))
        )


# --- forget ---------------------------------------------------------------------------


def fill_pipeline(store: StateStore, pipeline: str) -> str:
    """A pipeline with two tables in one run, chunks, both checkpoints and its lock."""
    run_id = store.create_run(pipeline, {}).run_id
    for table in ("shop.a", "shop.b"):
        store.add_run_table(
            run_id,
            table,
            "snapshot",
            strategy="even",
            chunk_key=["id"],
            info={},
            chunks=[chunk(run_id, table, i, 0, None, None) for i in range(2)],
        )
        store.save_table_checkpoint(
            TableCheckpoint(pipeline, table, 1, POS, 2, "m", run_id, datetime.now(UTC))
        )
    store.save_capture_checkpoint(run_id, POS, 1, 4)
    store.acquire_lock(pipeline, f"holder-{pipeline}")
    return run_id


def test_forget_tables_and_dry_run(store: StateStore) -> None:
    run_id = fill_pipeline(store, "shop")
    other_run = fill_pipeline(store, "other")
    expected = {
        "runs": 0,
        "run_tables": 1,
        "chunks": 2,
        "capture_checkpoints": 0,
        "table_checkpoints": 1,
        "locks": 0,
    }
    assert store.forget("shop", ["shop.a"], dry_run=True) == expected
    assert len(store.chunks(run_id)) == 4 and len(store.table_checkpoints("shop")) == 2
    assert store.forget("shop", ["shop.a"]) == expected
    assert [t.table for t in store.run_tables(run_id)] == ["shop.b"]
    assert {c.table for c in store.chunks(run_id)} == {"shop.b"}
    assert [c.table for c in store.table_checkpoints("shop")] == ["shop.b"]
    assert store.capture_checkpoint(run_id) is not None and store.lock_info("shop") is not None
    assert len(store.chunks(other_run)) == 4  # same table names, other pipeline: untouched


def test_forget_everything_of_a_pipeline(store: StateStore) -> None:
    run_id = fill_pipeline(store, "shop")
    other_run = fill_pipeline(store, "other")
    expected = {
        "runs": 1,
        "run_tables": 2,
        "chunks": 4,
        "capture_checkpoints": 1,
        "table_checkpoints": 2,
        "locks": 1,
    }
    assert store.forget("shop", dry_run=True) == expected
    assert store.get_run(run_id).run_id == run_id and store.lock_info("shop") is not None
    assert store.forget("shop") == expected
    assert store.runs("shop") == [] and store.chunks(run_id) == []
    assert store.table_checkpoints("shop") == [] and store.capture_checkpoint(run_id) is None
    assert store.lock_info("shop") is None
    assert store.forget("shop") == dict.fromkeys(expected, 0)
    assert len(store.chunks(other_run)) == 4 and store.lock_info("other") is not None
    store.create_run("shop", {})  # the pipeline starts over


# --- the lock -------------------------------------------------------------------------


def test_lock_is_reentrant_for_its_holder_and_refused_to_others(store: StateStore) -> None:
    store.acquire_lock("shop", "run-A")
    first = store.lock_info("shop")
    assert first is not None
    assert (first.holder, first.hostname, first.pid) == ("run-A", socket.gethostname(), os.getpid())
    assert is_utc(first.acquired_at)
    store.acquire_lock("shop", "run-A")  # re-entrant
    again = store.lock_info("shop")
    assert again is not None and again.acquired_at == first.acquired_at
    assert again.refreshed_at >= first.refreshed_at

    with pytest.raises(RunLocked) as refused:
        store.acquire_lock("shop", "run-B", config_path="configs/shop.yaml")
    message = str(refused.value)
    for part in (
        "pipeline shop",
        "locked by run run-A",
        f"host {socket.gethostname()}",
        f"pid {os.getpid()}",
        f"since {first.acquired_at.isoformat(timespec='seconds')}",
        "wait for it to finish",
        "`tidemark reset --config configs/shop.yaml --unlock --yes`",
    ):
        assert part in message
    store.acquire_lock("other", "run-B")  # one lock per pipeline

    store.release_lock("shop", "run-B")  # not its lock: nothing happens
    assert store.lock_info("shop") is not None
    store.release_lock("shop", "run-A")
    assert store.lock_info("shop") is None
    store.acquire_lock("shop", "run-B", track_pid=False)
    lease_only = store.lock_info("shop")
    assert lease_only is not None and lease_only.pid is None
    store.force_unlock("shop")
    assert store.lock_info("shop") is None


def run_worker(url: str, holder: str, pipelines: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.unit.state_lock_worker", url, holder, pipelines],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_lock_of_a_dead_process_on_this_host_is_taken_over(
    store: StateStore, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker = run_worker(url, "ghost", "shop")
    out, err = worker.communicate("go\nexit\n", timeout=120)
    assert (out.split(), worker.returncode) == (["ready", "acquired"], 0), err
    ghost = store.lock_info("shop")
    assert ghost is not None and ghost.pid == worker.pid  # the worker has exited

    # the same dead pid on another host proves nothing: still locked
    run_sql(url, update(state.LOCKS).values(hostname="elsewhere.example"))
    with pytest.raises(RunLocked, match=re.escape("run ghost on host elsewhere.example")):
        store.acquire_lock("shop", "alive")

    run_sql(url, update(state.LOCKS).values(hostname=socket.gethostname()))
    with caplog.at_level(logging.WARNING, logger="tidemark.state"):
        store.acquire_lock("shop", "alive")
    taken = store.lock_info("shop")
    assert taken is not None and (taken.holder, taken.pid) == ("alive", os.getpid())
    assert "from run ghost" in caplog.text and "its process is gone" in caplog.text


def test_lock_not_refreshed_within_its_lease_is_taken_over(
    store: StateStore, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The holder's own lease decides (it is recorded with the lock), not the taker's."""
    store.acquire_lock(
        "shop", "slow", lease_seconds=2 * 3600
    )  # this process: alive, only the lease can expire
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    run_sql(url, update(state.LOCKS).values(refreshed_at=an_hour_ago))
    with pytest.raises(RunLocked, match=r"locked by run slow .*lease 7200 s"):
        store.acquire_lock("shop", "eager", lease_seconds=60)
    run_sql(url, update(state.LOCKS).values(refreshed_at=an_hour_ago - timedelta(hours=2)))
    with caplog.at_level(logging.WARNING, logger="tidemark.state"):
        store.acquire_lock("shop", "eager", lease_seconds=1800)
    taken = store.lock_info("shop")
    assert taken is not None and taken.holder == "eager" and taken.lease_seconds == 1800
    assert "not renewed within its lease of 7200 s" in caplog.text
    with pytest.raises(RunLocked, match="locked by run eager"):
        store.acquire_lock("shop", "slow")  # the old holder learns it lost the lock


def test_two_processes_race_for_the_lock(store: StateStore, url: str) -> None:
    pipelines = ["race0", "race1", "race2"]
    workers = [run_worker(url, f"racer-{n}", ",".join(pipelines)) for n in range(2)]
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        for pipeline in pipelines:
            for w in workers:  # both are waiting on stdin: release them together
                assert w.stdin is not None
                w.stdin.write("go\n")
                w.stdin.flush()
            lines = [w.stdout.readline().strip() for w in workers if w.stdout is not None]
            winners = [n for n, line in enumerate(lines) if line == "acquired"]
            assert len(winners) == 1, (pipeline, lines)
            winner = winners[0]
            loser_line = lines[1 - winner]
            assert loser_line.startswith(
                f"locked pipeline {pipeline} is locked by run racer-{winner} "
            )
            held = store.lock_info(pipeline)
            assert held is not None
            assert (held.holder, held.pid) == (f"racer-{winner}", workers[winner].pid)
    finally:
        results = [w.communicate("exit\n", timeout=120) for w in workers]
    codes = sorted(w.returncode for w in workers)
    assert codes in ([0, 3], [3, 3]), results  # a racer that lost at least once exits 3


# --- many tables at once (issue 16) ------------------------------------------------------


def test_a_store_of_schema_2_gets_the_table_sets_table(store: StateStore, url: str) -> None:
    store.close()
    run_sql(url, text("DROP TABLE tm_table_sets"))
    run_sql(url, text("ALTER TABLE tm_chunks DROP COLUMN file_ranges"))  # schema 4's
    run_sql(url, update(state.SCHEMA).values(version=2))
    with StateStore(url) as migrated:
        assert migrated.table_set("shop") is None
        migrated.save_table_set(
            "shop", "r1", [{"pattern": "crm.*", "index": 0, "tables": ["crm.a"]}], []
        )
        assert migrated.table_set("shop").patterns[0]["tables"] == ["crm.a"]  # type: ignore[union-attr]
    assert run_sql(url, select(state.SCHEMA.c.version)) == [(state.code_schema_version(),)]


def test_a_store_of_schema_3_gets_the_chunks_file_ranges(store: StateStore, url: str) -> None:
    """Schema 4: a chunk's files as the driver's read wrote them; a store's existing chunks have
    none."""
    run = store.create_run("shop", {"tables": ["shop.a"]})
    store.add_run_tables(
        run.run_id,
        [
            state.PlannedTable(
                "shop.a",
                "snapshot",
                "even",
                ["id"],
                {},
                [
                    chunk(run.run_id, "shop.a", 0, 0, None, None),
                    chunk(run.run_id, "shop.a", 1, 0, None, None),
                ],
            )
        ],
    )
    store.mark_chunks_done(run.run_id, [state.ChunkRead("shop.a", 0, 5, 50, "/a")], high=POS)
    store.close()
    run_sql(url, text("ALTER TABLE tm_chunks DROP COLUMN file_ranges"))
    run_sql(url, update(state.SCHEMA).values(version=3))
    written = {
        "file": "/b/c000001-000.parquet",
        "min_key": [6],
        "max_key": [9],
        "rows": 4,
        "bytes": 40,
    }
    with StateStore(url) as migrated:
        migrated.mark_chunks_done(
            run.run_id, [state.ChunkRead("shop.a", 1, 4, 40, "/b", ranges=[written])], high=POS
        )
        assert [(c.index, c.path, c.ranges) for c in migrated.chunks(run.run_id)] == [
            (0, "/a", None),
            (1, "/b", [written]),
        ]
    assert run_sql(url, select(state.SCHEMA.c.version)) == [(state.code_schema_version(),)]


def test_many_tables_are_planned_read_reconciled_and_published_in_one_transaction_each(
    store: StateStore,
) -> None:
    run = store.create_run("shop", {"tables": ["shop.a", "shop.b"]})
    plans = [
        state.PlannedTable(
            t, "snapshot", "even", ["id"], {"n": i}, [chunk(run.run_id, t, 0, 0, None, None)]
        )
        for i, t in enumerate(["shop.a", "shop.b"])
    ]
    store.add_run_tables(run.run_id, plans)
    assert [(t.table, t.status, t.info) for t in store.run_tables(run.run_id)] == [
        ("shop.a", "planned", {"n": 0}),
        ("shop.b", "planned", {"n": 1}),
    ]
    written = {
        "file": "/a/c000000-000.parquet",
        "min_key": [1],
        "max_key": [5],
        "rows": 5,
        "bytes": 50,
    }
    store.mark_chunks_done(
        run.run_id,
        [
            state.ChunkRead("shop.a", 0, 5, 50, "/a", ranges=[written]),
            state.ChunkRead("shop.b", 0, 6, 60, "/b"),
        ],
        high=POS,
    )
    assert [
        (c.table, c.status, c.rows, c.path, c.high, c.ranges) for c in store.chunks(run.run_id)
    ] == [("shop.a", "done", 5, "/a", POS, [written]), ("shop.b", "done", 6, "/b", POS, None)]
    with pytest.raises(StateError):
        store.mark_chunks_done(run.run_id, [state.ChunkRead("shop.zz", 0, 1, 1, "/z")], high=POS)
    store.reconciled_tables(
        run.run_id, [("shop.a", 5, {"reconciled_dir": "/ra"}), ("shop.b", 7, {"n": 9})]
    )
    assert [(t.table, t.status, t.rows, t.info) for t in store.run_tables(run.run_id)] == [
        ("shop.a", "reconciled", 5, {"n": 0, "reconciled_dir": "/ra"}),
        ("shop.b", "reconciled", 7, {"n": 9}),
    ]
    with pytest.raises(StateError, match=r"shop\.zz is not part of run"):
        store.reconciled_tables(run.run_id, [("shop.a", 5, {}), ("shop.zz", 1, {})])
    assert store.run_tables(run.run_id)[0].info == {
        "n": 0,
        "reconciled_dir": "/ra",
    }  # nothing of it written
    now = datetime.now(UTC)
    store.publish_tables(
        run.run_id,
        [
            TableCheckpoint("shop", t, 1, POS, 5, f"/{t}", run.run_id, now)
            for t in ("shop.a", "shop.b")
        ],
    )
    assert [(c.table, c.version) for c in store.table_checkpoints("shop")] == [
        ("shop.a", 1),
        ("shop.b", 1),
    ]
    assert {t.status for t in store.run_tables(run.run_id)} == {"published"}


def test_the_table_set_is_peeked_without_writing(
    store: StateStore, url: str, tmp_path: Path
) -> None:
    from orchestrator.state.many import peek_table_set

    assert peek_table_set(url, "shop") is None
    store.save_table_set(
        "shop", "r2", [{"pattern": "crm.*", "index": 0, "tables": ["crm.b"]}], ["crm.gone"]
    )
    found = peek_table_set(url, "shop")
    assert found is not None and found.run_id == "r2" and found.dropped == ["crm.gone"]
    missing = tmp_path / "nowhere" / "state.db"
    assert peek_table_set(f"sqlite:///{missing}", "shop") is None
    assert not missing.parent.exists(), "peeking creates nothing"


def test_segment_marks_are_the_voided_tables_only(store: StateStore) -> None:
    run = store.create_run("shop", {"tables": ["shop.a", "shop.b"]})
    store.add_run_tables(
        run.run_id,
        [
            state.PlannedTable("shop.a", "snapshot", None, ["id"], {"segments_after": 7}, []),
            state.PlannedTable("shop.b", "snapshot", None, ["id"], {"x": 1}, []),
        ],
    )
    assert store.segment_marks(run.run_id) == {"shop.a": 7}


def test_a_run_of_many_tables_advances_and_republishes_them_in_bulk(store: StateStore) -> None:
    """`advance_tables` moves every table of a status (merging info) in one transaction;
    `publish_tables` replaces existing checkpoints and inserts new ones in the same call;
    `run_tables_where` / `run_table_states` answer without the others' info."""
    tables = ["shop.a", "shop.b", "shop.c"]
    run = store.create_run("shop", {"tables": tables})
    store.add_run_tables(
        run.run_id,
        [
            state.PlannedTable(t, "incremental", None, ["id"], {"n": i}, [])
            for i, t in enumerate(tables)
        ],
    )
    store.set_table_status(run.run_id, "shop.c", "failed", info={"failure": {"step": "plan"}})
    store.set_table_status(
        run.run_id, "shop.b", "planned", info={"reread_pending": {"what": "ALTER"}}
    )
    assert [
        r.table
        for r in store.run_tables_where(run.run_id, status="planned", info_key="reread_pending")
    ] == ["shop.b"]
    assert [r.table for r in store.run_tables_where(run.run_id, status="failed")] == ["shop.c"]
    assert store.advance_tables(run.run_id, "planned", "captured", {"captured_to": POS}) == [
        "shop.a",
        "shop.b",
    ]
    assert [(t, m, s) for t, m, s in store.run_table_states(run.run_id)] == [
        ("shop.a", "incremental", "captured"),
        ("shop.b", "incremental", "captured"),
        ("shop.c", "incremental", "failed"),
    ]
    assert store.run_tables(run.run_id)[1].info == {
        "n": 1,
        "reread_pending": {"what": "ALTER"},
        "captured_to": POS,
    }
    now = datetime.now(UTC)
    store.publish_tables(
        run.run_id, [TableCheckpoint("shop", "shop.a", 1, POS, 5, "/a", run.run_id, now)]
    )
    store.publish_tables(
        run.run_id,
        [
            TableCheckpoint("shop", t, 2, POS, 6, f"/{t}", run.run_id, now)
            for t in ("shop.a", "shop.b")
        ],
    )
    assert [(c.table, c.version, c.rows, c.manifest) for c in store.table_checkpoints("shop")] == [
        ("shop.a", 2, 6, "/shop.a"),
        ("shop.b", 2, 6, "/shop.b"),
    ]
    assert [(r.table, r.status, r.version) for r in store.run_tables(run.run_id)][:2] == [
        ("shop.a", "published", 2),
        ("shop.b", "published", 2),
    ]


def test_the_info_of_many_tables_is_merged_in_one_call(store: StateStore) -> None:
    """`merge_tables_info`: each named table's entries merged into its info (None kept as a
    value), its status and the other tables untouched; what a capture's end records for
    thousands of tables held back for an XA transaction, in one transaction."""
    run = store.create_run("shop", {"tables": []})
    start = {"file": "b.000001", "pos": 4}
    store.add_run_tables(
        run.run_id,
        [
            state.PlannedTable(
                f"shop.t{i}", "incremental", None, ["id"], {"from_position": start}, []
            )
            for i in range(3)
        ],
    )
    store.set_table_status(run.run_id, "shop.t1", "planned", info={"next_from": start})
    held = {"file": "b.000001", "pos": 9, "xa_foreign": True}
    store.merge_tables_info(
        run.run_id, {"shop.t0": {"next_from": held}, "shop.t1": {"next_from": None}}
    )
    store.merge_tables_info(run.run_id, {})
    tables = {r.table: r for r in store.run_tables(run.run_id)}
    assert tables["shop.t0"].info == {"from_position": start, "next_from": held}
    assert tables["shop.t1"].info == {"from_position": start, "next_from": None}
    assert tables["shop.t2"].info == {"from_position": start}
    assert {r.status for r in tables.values()} == {"planned"}
