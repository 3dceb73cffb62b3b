"""Tables without a key: published exactly, as the multiset of their rows.

A private MariaDB; each test compares the source and the lake as multisets (a Counter of row
tuples), the lake read through pyiceberg (the catalog), after plain ``tidemark run``s: identical
rows, a ``DELETE ... LIMIT 1`` of one of several identical rows, updates that make rows identical
and tell them apart again, a filter, a snapshot under concurrent inserts, deletes and updates, a
catch-up, TRUNCATE, an XA transaction prepared across two runs, a kill -9 and a rerun, MySQL's
quiet window (the reader made to believe the server has no snapshot position) and the lock.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import connect
from orchestrator.app.demo.verify import normalize, source_rows
from orchestrator.app.run import run_command
from orchestrator.config import PipelineConfig, load_config
from orchestrator.lake import layout
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.failed import TablesFailed
from orchestrator.pipeline.read import keyless as keyless_read
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.schema.tables import ColumnInfo
from orchestrator.source.connection import Source
from tests.conftest import (
    assert_lake_equals_source,
    chunked_config,
    fresh_database,
    pipeline_config,
    start_run,
    write_config,
)
from tests.iceberg_readers import pyiceberg_table

pytestmark = pytest.mark.integration

LOG = (
    "CREATE TABLE {db}.log (a INT, b VARCHAR(20), c DECIMAL(8, 2), d DOUBLE, "
    "t DATETIME(3)) ENGINE=InnoDB"
)
#: 1,200 rows: 200 kinds, six of each (NULLs and -0.0 among them)
FILL = (
    "INSERT INTO {db}.log SELECT seq % 200, CONCAT('k', seq % 7), "
    "IF(seq % 5 = 0, NULL, (seq % 200) / 4), IF(seq % 200 = 3, -0.0, seq % 13), "
    "IF(seq % 3 = 0, NULL, '2024-02-29 12:00:00.5') FROM seq_0_to_1199"
)


def _pipeline(
    mariadb: LocalMariaDB, tmp_path: Path, db: str, *, rows_sql: str = FILL, **entry: Any
) -> PipelineConfig:
    fresh_database(mariadb, db, LOG.format(db=db), rows_sql.format(db=db))
    path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": f"{db}.log", **entry}],
            name=db,
            defaults={"chunk_size": 300, "read_margin_seconds": 0.05},
        ),
    )
    return load_config(path)


def _run(config: PipelineConfig, tables: list[str] | None = None) -> int:
    return run_command(config, tables=tables or [], snapshot=False, chunk_size=None, progress=False)


def _source(
    config: PipelineConfig, name: str, where: str | None = None
) -> Counter[tuple[Any, ...]]:
    with Source.from_pipeline(config) as source:
        info = source.table_info(name)
    conn = connect(config.source.host, config.source.port, "root", "")
    try:
        rows = source_rows(conn, info, where)
    finally:
        conn.close()
    return Counter(
        tuple(_value(c, v) for c, v in zip(info.columns, row, strict=True)) for row in rows
    )


def _value(column: ColumnInfo, value: Any) -> Any:
    """The oracle's value (`normalize`), a BIT's bits as unsigned on both sides (the lake holds
    BIT(64) as a signed int64: docs/types.md)."""
    found = normalize(column, value)
    return found & 0xFFFFFFFFFFFFFFFF if column.data_type == "bit" and found is not None else found


def _lake(config: PipelineConfig, name: str) -> Counter[tuple[Any, ...]]:
    with Source.from_pipeline(config) as source:
        info = source.table_info(name)
    rows = pyiceberg_table(config, name).to_pylist()
    return Counter(tuple(_value(c, row[c.name]) for c in info.columns) for row in rows)


def _assert_same(config: PipelineConfig, name: str, where: str | None = None) -> None:
    source, lake = _source(config, name, where), _lake(config, name)
    assert lake == source, (
        f"{name}: source has {source.total()} rows, the lake {lake.total()}; "
        f"missing {list((source - lake).items())[:5]}, extra {list((lake - source).items())[:5]}"
    )


def _manifest(config: PipelineConfig, name: str) -> dict[str, Any]:
    path = Path(table_dir(config, name)) / "_tidemark" / "current.json"
    return dict(json.loads(path.read_text()))


def test_identical_rows_then_deletes_and_updates_as_multisets(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = "keyless_multiset"
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    caplog.set_level(logging.INFO)
    assert _run(config) == 0
    _assert_same(config, name)
    first = _manifest(config, name)
    assert first["chunk_key"] == [] and len(first["files"]) >= 4  # sorted by row hash, 300 a file
    assert "read in a consistent snapshot at" in caplog.text

    statements = [
        "DELETE FROM log WHERE a = 7 LIMIT 1",  # one of six identical rows
        "DELETE FROM log WHERE a = 8 AND c IS NULL LIMIT 1",  # NULLs are equal to NULLs
        "UPDATE log SET b = 'k1', d = 1 WHERE a = 9",  # six rows made identical to each other
        "UPDATE log SET b = 'apart' WHERE a = 9 LIMIT 2",  # two of them told apart again
        "UPDATE log SET d = 0.0 WHERE a = 3 LIMIT 1",  # -0.0 -> 0.0: the same row
        "INSERT INTO log SELECT * FROM log WHERE a = 10",  # every row of a kind twice
        "INSERT INTO log VALUES (500, 'new', NULL, NULL, NULL), (500, 'new', NULL, NULL, NULL)",
        "DELETE FROM log WHERE a = 11",
    ]
    mariadb.execute(*statements, database=db)
    caplog.clear()
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 0)  # small files are not merged here
    assert _run(config) == 0
    _assert_same(config, name)
    assert "row change(s) after" in caplog.text

    # one row removed: only the file that holds it is written again
    second = _manifest(config, name)
    mariadb.execute("DELETE FROM log WHERE a = 12 LIMIT 1", database=db)
    assert _run(config) == 0
    _assert_same(config, name)
    third = _manifest(config, name)
    assert len(set(second["files"]) - set(third["files"])) == 1, (second["files"], third["files"])
    assert len(third["files"]) == len(second["files"])

    # a run without a change publishes no version
    assert _run(config) == 0
    assert _manifest(config, name)["version"] == third["version"]


def test_filter_counts_before_and_after_images(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    db = "keyless_filter"
    where = "a < 100"
    config = _pipeline(mariadb, tmp_path, db, where=where)
    name = f"{db}.log"
    assert _run(config) == 0
    _assert_same(config, name, where)
    mariadb.execute(
        "UPDATE log SET a = a + 100 WHERE a = 5 LIMIT 2",  # out of the filter: removed
        "UPDATE log SET a = a - 100 WHERE a = 150 LIMIT 3",  # into it: added
        "UPDATE log SET a = a + 1 WHERE a = 160",  # outside before and after: nothing
        "UPDATE log SET b = 'in' WHERE a = 6",  # inside before and after
        "DELETE FROM log WHERE a = 170 LIMIT 1",  # outside: nothing to remove
        "INSERT INTO log VALUES (1, 'k1', NULL, 1, NULL), (300, 'x', NULL, NULL, NULL)",
        database=db,
    )
    assert _run(config) == 0
    _assert_same(config, name, where)


def test_doctor_and_plan_name_the_multiset_path(
    mariadb: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.app.doctor import doctor_command
    from orchestrator.app.plan import plan_command

    db = "keyless_doctor"
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    doctor_command(config)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if f"chunk key {name}" in x)
    assert line.startswith("PASS") and "multiset of its rows" in line, line
    assert "consistent snapshot's binlog position" in line, line
    assert plan_command(config, [], as_json=False) == 0
    out = capsys.readouterr().out
    assert "keyless" in out and "driver" in out and "multiset of its rows" in out, out
    assert plan_command(config, [], as_json=True) == 0
    document = json.loads(capsys.readouterr().out)
    (table,) = document["tables"]
    assert table["strategy"] == "keyless" and table["chunk_key"] == []
    assert table["read_by"] == "driver" and "multiset" in table["reason"]


# --------------------------------------------------------------------------- under writers


class _Writer(threading.Thread):
    """Inserts, deletes (LIMIT 1 of identical rows) and updates on ``db.log`` until stopped."""

    def __init__(self, mariadb: LocalMariaDB, db: str, seed: int, burst: bool = False) -> None:
        super().__init__(daemon=True)
        self.mariadb, self.db, self.random = mariadb, db, random.Random(seed)
        self.burst = burst  # write for 0.1 s, then pause for 0.4 s
        self.stop_event = threading.Event()
        self.changes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = self.mariadb.connect(database=self.db)
            with conn.cursor() as cur:
                while not self.stop_event.is_set():
                    kind, a = self.random.random(), self.random.randrange(200)
                    if kind < 0.35:
                        cur.execute("INSERT INTO log VALUES (%s, 'w', NULL, 1, NULL)", (a,))
                    elif kind < 0.6:
                        cur.execute("DELETE FROM log WHERE a = %s LIMIT 1", (a,))
                    elif kind < 0.85:
                        cur.execute("UPDATE log SET d = d + 1 WHERE a = %s LIMIT 2", (a,))
                    else:  # a transaction of several changes
                        cur.execute("BEGIN")
                        cur.execute("UPDATE log SET b = 'u' WHERE a = %s LIMIT 1", (a,))
                        cur.execute("INSERT INTO log SELECT * FROM log WHERE a = %s LIMIT 1", (a,))
                        cur.execute("COMMIT")
                    self.changes += 1
                    time.sleep(0.002)
                    if self.burst and self.changes % 40 == 0:
                        time.sleep(0.4)
            conn.close()
        except BaseException as exc:
            self.error = exc


@pytest.fixture
def writers() -> Iterator[list[_Writer]]:
    started: list[_Writer] = []
    yield started
    for writer in started:
        writer.stop_event.set()
        writer.join(30)


def _start_writers(
    mariadb: LocalMariaDB, db: str, started: list[_Writer], count: int = 2, burst: bool = False
) -> list[_Writer]:
    for seed in range(count):
        writer = _Writer(mariadb, db, seed, burst)
        writer.start()
        started.append(writer)
    deadline = time.monotonic() + 30
    while min(w.changes for w in started) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    return started


def _stop(started: list[_Writer]) -> int:
    for writer in started:
        writer.stop_event.set()
        writer.join(30)
        assert writer.error is None, writer.error
    return sum(w.changes for w in started)


def test_snapshot_under_concurrent_writes_then_catch_up(
    mariadb: LocalMariaDB, tmp_path: Path, writers: list[_Writer]
) -> None:
    db = "keyless_writers"
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    mariadb.execute(
        f"INSERT INTO {db}.log SELECT * FROM {db}.log",
        f"INSERT INTO {db}.log SELECT * FROM {db}.log",
    )
    _start_writers(mariadb, db, writers)
    before = sum(w.changes for w in writers)
    assert _run(config) == 0  # the snapshot, while the writers write
    during = sum(w.changes for w in writers) - before
    assert during >= 5, f"the writers must have changed the table during the run ({during})"
    assert _run(config) == 0  # a catch-up, still under writes
    _stop(writers)
    assert _run(config) == 0
    _assert_same(config, name)


def test_truncate_is_a_re_read(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = "keyless_truncate"
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    assert _run(config) == 0
    mariadb.execute(
        "DELETE FROM log WHERE a = 1 LIMIT 2",
        "TRUNCATE TABLE log",
        "INSERT INTO log VALUES (1, 'a', NULL, NULL, NULL), (1, 'a', NULL, NULL, NULL)",
        "INSERT INTO log VALUES (2, 'b', 1.5, -0.0, '2020-01-01')",
        "DELETE FROM log WHERE a = 1 LIMIT 1",
        database=db,
    )
    caplog.set_level(logging.INFO)
    assert _run(config) == 0
    assert f"table {name}: TRUNCATE" in caplog.text and "re-read" in caplog.text
    _assert_same(config, name)


def test_xa_prepared_across_runs_counts_each_change_once(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """An XA transaction prepared at one run's end holds the table's next start back to where it
    began: the next run reads changes it already applied again, and must not count them twice."""
    db = "keyless_xa"
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    assert _run(config) == 0
    mariadb.execute(
        "XA START 'k'",
        f"INSERT INTO {db}.log VALUES (900, 'xa', NULL, NULL, NULL)",
        "XA END 'k'",
        "XA PREPARE 'k'",
    )
    try:
        mariadb.execute(
            "INSERT INTO log VALUES (901, 'after', NULL, NULL, NULL)",
            "DELETE FROM log WHERE a = 7 LIMIT 1",
            database=db,
        )
        assert _run(config) == 0  # published without the prepared row, its start held back
        _assert_same(config, name)
    finally:
        mariadb.execute("XA COMMIT 'k'")
    mariadb.execute("INSERT INTO log VALUES (902, 'later', NULL, NULL, NULL)", database=db)
    assert _run(config) == 0  # reads 901 and the delete again: each counts once
    _assert_same(config, name)
    assert _source(config, name)[(900, "xa", None, None, None)] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "failpoint", ["read.batch_done:1", "capture.flushed:1", "publish.file_moved:1"]
)
def test_killed_run_resumes_exactly(mariadb: LocalMariaDB, tmp_path: Path, failpoint: str) -> None:
    """``kill -9`` of a run (a snapshot, then a catch-up) at a step boundary; the rerun resumes
    and the lake equals the source, no change counted twice or lost."""
    db = "keyless_kill_" + failpoint.split(".")[1].split(":")[0]
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    path = Path(config.path)
    mariadb.execute("INSERT INTO log SELECT * FROM log WHERE a < 50", database=db)
    for round_ in range(2):  # a snapshot, then a catch-up
        if round_:
            mariadb.execute(
                "DELETE FROM log WHERE a = 20 LIMIT 3",
                "UPDATE log SET b = 'kill' WHERE a = 21 LIMIT 2",
                "INSERT INTO log SELECT * FROM log WHERE a = 22",
                database=db,
            )
        run = start_run(path, failpoint)
        run.wait(120)
        # a snapshot writes no change segment (nothing changed meanwhile), a catch-up reads no chunk
        if round_ in {"read": (0,), "capture": (1,), "publish": (0, 1)}[failpoint.split(".")[0]]:
            assert run.returncode == -9, run.stderr.read() if run.stderr else ""
        mariadb.execute(
            "INSERT INTO log VALUES (800, 'meanwhile', NULL, NULL, NULL)",
            "DELETE FROM log WHERE a = 30 LIMIT 1",
            database=db,
        )
        assert _run(config) == 0  # resumes the killed run (its H may be before the meanwhile)
        assert _run(config) == 0
        _assert_same(config, name)


def test_quiet_window_where_the_server_gives_no_snapshot_position(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    writers: list[_Writer],
) -> None:
    """The reader believes the server is MySQL: it reads in a window of the binlog with no change
    of the table, tried again while writers change it in bursts; the result is exact."""
    monkeypatch.setattr(
        keyless_read,
        "how_to_snapshot",
        lambda source, lock_allowed: "lock" if lock_allowed else "quiet",
    )
    db = "keyless_quiet"
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    _start_writers(mariadb, db, writers, count=1, burst=True)
    caplog.set_level(logging.INFO)
    assert _run(config) == 0
    assert "read in a consistent snapshot in a quiet binlog window" in caplog.text
    assert _run(config) == 0
    _stop(writers)
    assert _run(config) == 0
    _assert_same(config, name)


def test_no_quiet_window_fails_the_table_and_a_lock_reads_it(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    writers: list[_Writer],
) -> None:
    """Without a quiet window within ``source.read_timeout`` the table fails on its own, naming
    the fix; with ``keyless_lock: true`` a brief lock places the read, under the same writes."""
    monkeypatch.setattr(
        keyless_read,
        "how_to_snapshot",
        lambda source, lock_allowed: "lock" if lock_allowed else "quiet",
    )
    db = "keyless_busy"
    config = _pipeline(mariadb, tmp_path, db)
    config = dataclasses.replace(config, source=dataclasses.replace(config.source, read_timeout=2))
    name = f"{db}.log"
    _start_writers(mariadb, db, writers, count=2)
    with pytest.raises(TablesFailed) as failed:
        _run(config)
    assert failed.value.exit_code == 1
    failure = _failure(config, name)
    assert "no read of it could be placed at one position" in failure, failure
    assert "keyless_lock: true" in failure, failure

    locked = dataclasses.replace(
        config, tables=(dataclasses.replace(config.tables[0], keyless_lock=True),)
    )
    assert _run(locked) == 0
    _stop(writers)
    assert _run(locked) == 0
    _assert_same(locked, name)


def _failure(config: PipelineConfig, name: str) -> str:
    from orchestrator.pipeline.context import open_store

    store = open_store(config)
    try:
        run = store.runs(config.pipeline, limit=1)[0]
        record = {r.table: r for r in store.run_tables(run.run_id)}[name]
        return str(record.info["failure"]["reason"])
    finally:
        store.close()


def test_every_type_removed_and_updated_by_the_binlog(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Rows of every type of the mapping, each twice, read by the snapshot; the binlog then
    removes one of each pair (its image must find the row the snapshot read: the same values on
    both paths) and updates the other."""
    from tests.integration.test_read import DB as TYPES_DB
    from tests.integration.test_read import create_types_table

    create_types_table(mariadb)
    db = "keyless_types"
    fresh_database(
        mariadb,
        db,
        f"CREATE TABLE {db}.t LIKE {TYPES_DB}.types",
        f"ALTER TABLE {db}.t DROP PRIMARY KEY",
    )
    conn = mariadb.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            for _ in range(2):
                cur.execute(f"INSERT INTO t SELECT * FROM {TYPES_DB}.types")
    finally:
        conn.close()
    name = f"{db}.t"
    path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(tmp_path, mariadb, [{"name": name}], name=db),
    )
    config = load_config(path)
    assert _run(config) == 0
    _assert_same(config, name)
    conn = mariadb.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            for row_id in sorted({r[0] for r in mariadb.execute(f"SELECT id FROM {name}")}):
                cur.execute("DELETE FROM t WHERE id = %s LIMIT 1", (row_id,))
                cur.execute("UPDATE t SET id = id + 100 WHERE id = %s", (row_id,))
    finally:
        conn.close()
    assert _run(config) == 0
    _assert_same(config, name)


def test_an_empty_table_then_rows(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    db = "keyless_empty"
    config = _pipeline(mariadb, tmp_path, db, rows_sql="DO 0")
    name = f"{db}.log"
    assert _run(config) == 0
    assert _manifest(config, name)["rows"] == 0
    mariadb.execute(
        "INSERT INTO log VALUES (1, 'a', NULL, NULL, NULL), (1, 'a', NULL, NULL, NULL)",
        "DELETE FROM log LIMIT 1",
        database=db,
    )
    assert _run(config) == 0
    _assert_same(config, name)
    assert _manifest(config, name)["rows"] == 1


def test_a_server_reading_committed_rows_still_gives_the_snapshot_its_position(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose transactions read committed rows (``transaction_isolation`` READ-COMMITTED,
    a common setting against gap locks): ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` takes no
    snapshot there, only REPEATABLE READ does, so a write committed after the snapshot's binlog
    position and before the read was read, then applied again from the binlog: a row twice in
    the lake, with exit 0. The snapshot's transaction now asks for REPEATABLE READ. The write
    comes right after the snapshot begins (`begin_snapshot`)."""
    db = "keyless_read_committed"
    config = _pipeline(mariadb, tmp_path, db)
    name = f"{db}.log"
    began = keyless_read.begin_snapshot

    def then_a_write(source: Source) -> Any:
        position = began(source)
        mariadb.execute(f"INSERT INTO {name} (a, b) VALUES (-1, 'after')")
        return position

    monkeypatch.setattr(keyless_read, "begin_snapshot", then_a_write)
    mariadb.execute("SET GLOBAL TRANSACTION ISOLATION LEVEL READ COMMITTED")
    try:
        assert _run(config) == 0
        monkeypatch.setattr(keyless_read, "begin_snapshot", began)
        assert _run(config) == 0
    finally:
        mariadb.execute("SET GLOBAL TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    _assert_same(config, name)
    assert _lake(config, name)[(-1, "after", None, None, None)] == 1


def test_rows_a_transaction_has_not_committed_are_never_read(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A server whose transactions read uncommitted rows (``transaction_isolation``
    READ-UNCOMMITTED): the snapshot's reads, by Spark and by the driver, took a row another
    transaction had written and then rolled back, which no binlog event ever took out: a row in
    the lake the source never had, with exit 0. Tidemark's sessions read REPEATABLE READ."""
    db = "read_uncommitted"
    fresh_database(
        mariadb,
        db,
        f"CREATE TABLE {db}.big (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.big SELECT seq, seq FROM seq_1_to_{LOCAL_ROWS + 1000}",
        f"CREATE TABLE {db}.small (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.small VALUES (1, 1)",
        f"ANALYZE TABLE {db}.big",
        LOG.format(db=db),
        FILL.format(db=db),
    )
    tables = [f"{db}.big", f"{db}.small", f"{db}.log"]
    config = load_config(chunked_config(tmp_path, mariadb, tables, name=db))
    writer = mariadb.connect()
    mariadb.execute("SET GLOBAL TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
    try:
        with writer.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO {db}.big VALUES (-1, -1)")
            cur.execute(f"INSERT INTO {db}.small VALUES (-1, -1)")
            cur.execute(f"INSERT INTO {db}.log (a, b) VALUES (-1, 'uncommitted')")
        assert _run(config) == 0
        writer.rollback()
        assert _run(config) == 0
    finally:
        mariadb.execute("SET GLOBAL TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        writer.close()
    assert_lake_equals_source(config, mariadb, tables[:2])
    _assert_same(config, tables[2])
