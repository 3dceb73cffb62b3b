"""Every change reaches the lake: TRUNCATE, DROP/CREATE, ALTER, STATEMENT-format sessions,
sessions logging row images without every column.

Plain ``tidemark run``s against a private MariaDB: after each, the lake equals the
source row for row (`verify_table`), the log names what happened and where, and the
table that needed a re-read is the only one whose files were written again.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.binlog.statements import Xid
from orchestrator.config import PipelineConfig
from orchestrator.pipeline.capture.xa import XA_KNOWN, xid_text
from orchestrator.pipeline.context import open_store, table_dir
from orchestrator.positions import BinlogPosition
from tests.conftest import assert_lake_equals_source, start_run
from tests.integration.conftest import before_first_pass, run_plain, two_table_pipeline
from tests.integration.test_failures import wait_until_stopped

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v VARCHAR(40), n INT)"
FILL = "INSERT INTO {db}.{name} SELECT seq, CONCAT('row ', seq), seq % 97 FROM seq_1_to_{rows}"


def _setup(mariadb: LocalMariaDB, tmp_path: Path, db: str) -> PipelineConfig:
    return two_table_pipeline(mariadb, tmp_path, db, TABLE, FILL, (4000, 3000))


def _run(config: PipelineConfig) -> None:
    run_plain(config)


def _manifest(config: PipelineConfig, table: str) -> dict[str, Any]:
    return dict(
        json.loads((Path(table_dir(config, table)) / "_tidemark" / "current.json").read_text())
    )


def _stats(config: PipelineConfig, table: str) -> dict[str, tuple[int, int]]:
    tdir = Path(table_dir(config, table))
    return {
        f: (os.stat(tdir / f).st_ino, os.stat(tdir / f).st_mtime_ns)
        for f in _manifest(config, table)["files"]
    }


CHANGES: dict[str, tuple[list[str], str]] = {
    # case: (statements between the runs, what the log names)
    "truncate": (
        ["TRUNCATE TABLE t", "INSERT INTO t VALUES (1, 'a', 1), (2, 'b', 2), (5000, 'c', 3)"],
        "TRUNCATE `TRUNCATE TABLE t`",
    ),
    "drop_create": (
        [
            "INSERT INTO t VALUES (4001, 'late', 0)",
            "DROP TABLE t",
            "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
            "INSERT INTO t VALUES (7, 'new', 7), (8, 'new', 8)",
        ],
        "DDL `DROP TABLE",
    ),
    "rename_swap": (
        [
            "CREATE TABLE t2 LIKE t",
            "INSERT INTO t2 VALUES (1, 'swapped', 1)",
            "RENAME TABLE t TO t_old, t2 TO t",
        ],
        "DDL `RENAME TABLE t TO t_old, t2 TO t`",
    ),
    "statement_session": (
        [
            "SET SESSION binlog_format = 'STATEMENT'",
            "UPDATE t SET n = n + 1000, v = 'by statement' WHERE id <= 99",
            "DELETE FROM t WHERE id BETWEEN 200 AND 210",
        ],
        "a statement-format change `UPDATE t SET n = n + 1000",
    ),
    "minimal_images": (
        [
            "SET SESSION binlog_row_image = 'MINIMAL'",
            "UPDATE t SET n = n + 1000, v = 'minimal' WHERE id <= 99",
            "DELETE FROM t WHERE id BETWEEN 200 AND 210",
        ],
        "a rows event without full row images",
    ),
}


@pytest.mark.parametrize("case", list(CHANGES))
def test_non_row_changes_are_re_read_for_that_table_alone(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    db = f"chg_{case}"
    config = _setup(mariadb, tmp_path, db)
    _run(config)
    other_before = _stats(config, f"{db}.other")
    statements, named = CHANGES[case]
    mariadb.execute(*statements, database=db)
    mariadb.execute(
        f"INSERT INTO {db}.t VALUES (9001, 'after', 1)"
    )  # rows after the change are kept
    caplog.set_level(logging.INFO)
    caplog.clear()
    _run(config)

    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith(f"table {db}.t: {named}")
        and line.endswith(": re-read")
        and " at binlog." in line
        for line in lines
    ), lines
    assert _manifest(config, f"{db}.t")["version"] == 2
    # The other table was not read again; without a change of its own it keeps version 1.
    assert _manifest(config, f"{db}.other")["version"] == 1
    assert _stats(config, f"{db}.other") == other_before
    # And a third run with nothing new applies nothing and re-reads nothing.
    caplog.clear()
    _run(config)
    assert not [r for r in caplog.records if r.getMessage().endswith(": re-read")]
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])


def test_added_column_publishes_the_new_schema(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = "chg_alter"
    config = _setup(mariadb, tmp_path, db)
    _run(config)
    first = _manifest(config, f"{db}.t")
    mariadb.execute(
        "UPDATE t SET v = 'before alter' WHERE id < 10",
        "ALTER TABLE t ADD COLUMN x INT NOT NULL DEFAULT 7",
        "UPDATE t SET x = 8 WHERE id BETWEEN 100 AND 120",
        database=db,
    )
    caplog.set_level(logging.INFO)
    _run(config)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    manifest = _manifest(config, f"{db}.t")
    assert [c["name"] for c in manifest["columns"]] == ["id", "v", "n", "x"]
    assert [c["name"] for c in first["columns"]] == ["id", "v", "n"]
    old = json.loads(
        (Path(table_dir(config, f"{db}.t")) / "_tidemark" / "versions" / "000001.json").read_text()
    )
    assert old == first  # readers of version 1 keep its columns
    assert any(
        "columns changed since version 1" in r.getMessage() and r.getMessage().endswith("re-read")
        for r in caplog.records
    )


def test_ddl_after_the_reads_re_reads_inside_the_run(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ALTER between the read step and H: the run re-reads the table from a new start and
    captures on to a new H, in the same run (a snapshot run, so no plan-time shape check)."""
    db = "chg_midrun"
    config = _setup(mariadb, tmp_path, db)
    calls = before_first_pass(
        monkeypatch,
        mariadb,
        db,
        "INSERT INTO t VALUES (4001, 'x', 1)",
        "ALTER TABLE t ADD COLUMN x INT NOT NULL DEFAULT 7",
        "INSERT INTO t VALUES (4002, 'y', 2, 9)",
        "INSERT INTO other VALUES (3001, 'o', 1)",
    )
    caplog.set_level(logging.INFO)
    _run(config)
    assert len(calls) == 2
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    assert [c["name"] for c in _manifest(config, f"{db}.t")["columns"]] == ["id", "v", "n", "x"]
    assert any(
        r.getMessage().startswith(f"table {db}.t: DDL `ALTER TABLE t ADD COLUMN x")
        for r in caplog.records
    )


def test_xa_rows_count_at_commit_and_a_prepared_one_waits(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rolled back: never published; committed (two-phase or ONE PHASE): published; prepared but
    not committed at H: not published, and published by the run that sees its commit."""
    db = "chg_xa"
    config = _setup(mariadb, tmp_path, db)
    _run(config)
    mariadb.execute(
        "XA START 'a'",
        f"INSERT INTO {db}.t VALUES (5001, 'xa a', 1)",
        f"UPDATE {db}.t SET v = 'xa a' WHERE id = 1",
        "XA END 'a'",
        "XA PREPARE 'a'",
        "XA ROLLBACK 'a'",
    )
    mariadb.execute(
        "XA START 'b'",
        f"INSERT INTO {db}.t VALUES (5002, 'xa b', 2)",
        f"UPDATE {db}.t SET v = 'xa b' WHERE id = 2",
        "XA END 'b'",
        "XA PREPARE 'b'",
    )
    mariadb.execute(f"INSERT INTO {db}.other VALUES (3001, 'between', 1)")
    mariadb.execute("XA COMMIT 'b'")
    mariadb.execute(
        "XA START 'c'",
        f"INSERT INTO {db}.t VALUES (5003, 'xa c', 3)",
        "XA END 'c'",
        "XA COMMIT 'c' ONE PHASE",
    )
    mariadb.execute(
        "XA START 'd'",
        f"INSERT INTO {db}.t VALUES (5004, 'xa d', 4)",
        f"UPDATE {db}.t SET v = 'xa d' WHERE id = 3",
        "XA END 'd'",
        "XA PREPARE 'd'",
    )
    try:
        mariadb.execute(f"INSERT INTO {db}.t VALUES (5005, 'after d', 5)")
        caplog.set_level(logging.INFO)
        _run(config)
        assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
        assert any(
            r.getMessage().startswith(f"table {db}.t: an XA transaction begun at ")
            for r in caplog.records
        )
        mariadb.execute(f"UPDATE {db}.t SET n = -1 WHERE id = 4")
    finally:
        mariadb.execute("XA COMMIT 'd'")
    _run(config)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    rows = {
        r[0]: r[1] for r in mariadb.execute(f"SELECT id, v FROM {db}.t WHERE id IN (1, 2, 3, 5004)")
    }
    assert rows == {1: "row 1", 2: "xa b", 3: "xa d", 5004: "xa d"}


def _setup_outside(mariadb: LocalMariaDB, tmp_path: Path, db: str) -> PipelineConfig:
    """`_setup` with a table ``outside`` the pipeline, its two tables published."""
    config = _setup(mariadb, tmp_path, db)
    mariadb.execute(f"CREATE TABLE {db}.outside (id INT PRIMARY KEY, v INT)")
    _run(config)
    return config


def _prepare_outside(mariadb: LocalMariaDB, db: str, xid: str) -> None:
    """An XA transaction with a row of ``outside`` only, prepared (not committed)."""
    mariadb.execute(
        f"XA START '{xid}'",
        f"INSERT INTO {db}.outside VALUES (1, 1)",
        f"XA END '{xid}'",
        f"XA PREPARE '{xid}'",
    )


def _checkpoints(config: PipelineConfig) -> dict[str, BinlogPosition]:
    store = open_store(config)
    try:
        return {
            c.table: BinlogPosition.from_json(c.position)
            for c in store.table_checkpoints(config.pipeline)
        }
    finally:
        store.close()


def _reread(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().endswith(": re-read")]


def test_an_xa_transaction_of_other_tables_across_a_run_end_reads_nothing_again(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An XA transaction of a table outside the pipeline, prepared before a run's end and
    committed after it: the run's tables go on from its end, each knowing the transaction
    (`XA_KNOWN`), so its commit reads nothing again. Before, the next run read the binlog from
    where it began; earlier still, its commit re-read every table of the run."""
    db = "chg_xa_out"
    config = _setup_outside(mariadb, tmp_path, db)
    other_before = _stats(config, f"{db}.other")
    _prepare_outside(mariadb, db, "out")
    try:
        mariadb.execute(f"UPDATE {db}.t SET v = 'before the end' WHERE id = 5")
        caplog.set_level(logging.INFO)
        _run(config)
        published = BinlogPosition.from_json(_manifest(config, f"{db}.t")["position"])
        assert set(_checkpoints(config).values()) == {published}
        known = [xid_text(Xid(b"out"))]
        assert _known(config) == {f"{db}.t": known, f"{db}.other": known}
    finally:
        mariadb.execute("XA COMMIT 'out'")
    mariadb.execute(f"UPDATE {db}.t SET v = 'after the commit' WHERE id = 6")
    _run(config)
    assert _reread(caplog) == []
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    assert _stats(config, f"{db}.other") == other_before  # no change of it: its files kept
    published = BinlogPosition.from_json(_manifest(config, f"{db}.t")["position"])
    assert set(_checkpoints(config).values()) == {published}
    assert _known(config) == {}  # its outcome seen: known no more


def _known(config: PipelineConfig) -> dict[str, list[str]]:
    """The XA transactions each table's checkpoint knows the commit of."""
    store = open_store(config)
    try:
        checkpoints = store.table_checkpoints(config.pipeline)
        return {c.table: c.position[XA_KNOWN] for c in checkpoints if XA_KNOWN in c.position}
    finally:
        store.close()


def test_an_xa_transaction_of_other_tables_prepared_for_runs_is_known_until_it_ends(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Prepared across several runs, it is known by each: no run reads the binlog from where it
    began, and its commit, when it comes, re-reads nothing (docs/limits.md had it: the commit
    re-read every table). A table snapshotted while it is prepared never saw it begin: the
    commit re-reads that table alone."""
    db = "chg_xa_stuck"
    config = _setup_outside(mariadb, tmp_path, db)
    _prepare_outside(mariadb, db, "stuck")
    try:
        for n in range(3):
            mariadb.execute(f"UPDATE {db}.t SET v = 'run {n}' WHERE id = {5 + n}")
            _run(config)
            published = BinlogPosition.from_json(_manifest(config, f"{db}.t")["position"])
            assert set(_checkpoints(config).values()) == {published}
        snapshot = run_command(
            config, tables=[f"{db}.other"], snapshot=True, chunk_size=None, progress=False
        )
        assert snapshot == 0
        assert set(_known(config)) == {f"{db}.t"}
        caplog.set_level(logging.INFO)
    finally:
        mariadb.execute("XA COMMIT 'stuck'")
    mariadb.execute(f"UPDATE {db}.t SET v = 'after' WHERE id = 9")
    _run(config)
    what = "XA COMMIT of a transaction prepared before this capture began"
    assert len(_reread(caplog)) == 1
    assert _reread(caplog)[0].startswith(f"table {db}.other: {what}"), _reread(caplog)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])


def test_what_a_table_knows_survives_a_capture_in_two_passes(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that re-reads a table captures in two passes, the second resumed from the first's
    checkpoint: the tables still know the transaction prepared since before the run (the
    checkpoint records the outcomes it passed; the table re-read keeps what its plan knew), so
    its commit re-reads nothing."""
    db = "chg_xa_two"
    config = _setup_outside(mariadb, tmp_path, db)
    _prepare_outside(mariadb, db, "two")
    try:
        _run(config)
        mariadb.execute(f"TRUNCATE TABLE {db}.t", f"INSERT INTO {db}.t VALUES (1, 'new', 1)")
        caplog.set_level(logging.INFO)
        _run(config)
        assert [m for m in _reread(caplog) if "TRUNCATE" in m]
        assert set(_known(config)) == {f"{db}.other", f"{db}.t"}
        caplog.clear()
    finally:
        mariadb.execute("XA COMMIT 'two'")
    _run(config)
    assert _reread(caplog) == []
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])


def test_an_xa_transaction_of_a_cascading_parent_outside_the_run_is_let_go(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows of a parent outside the run, decoded for the cascades into a run table: still
    prepared at the end of the run that began where it began, it is let go (the run's tables go
    on from that run's end, not from where it began: a transaction left prepared for days would
    have every run read the binlog since then again). Its commit re-reads the tables
    (docs/limits.md), and the lake still equals the source."""
    db = "chg_xa_parent"
    config = _setup(mariadb, tmp_path, db)
    mariadb.execute(
        f"CREATE TABLE {db}.parent (id INT PRIMARY KEY, w INT)",
        f"INSERT INTO {db}.parent SELECT seq, 0 FROM {db}.seq_0_to_96",
        f"ALTER TABLE {db}.t ADD FOREIGN KEY (n) REFERENCES {db}.parent (id) ON DELETE CASCADE",
    )
    _run(config)
    mariadb.execute(
        "XA START 'parent'",
        f"UPDATE {db}.parent SET w = 1 WHERE id = 3",
        "XA END 'parent'",
        "XA PREPARE 'parent'",
    )
    try:
        mariadb.execute(f"UPDATE {db}.t SET v = 'one' WHERE id = 5")
        _run(config)
        first = _checkpoints(config)
        mariadb.execute(f"UPDATE {db}.t SET v = 'two' WHERE id = 6")
        caplog.set_level(logging.INFO)
        _run(config)
        assert any("let go" in r.getMessage() for r in caplog.records)
        published = BinlogPosition.from_json(_manifest(config, f"{db}.t")["position"])
        assert set(_checkpoints(config).values()) == {published}
        assert all(first[t] < published for t in first)
    finally:
        mariadb.execute("XA COMMIT 'parent'")
    mariadb.execute(f"UPDATE {db}.t SET v = 'three' WHERE id = 7")
    _run(config)
    what = "XA COMMIT of a transaction prepared before this capture began"
    reread = {m.split(":", 1)[0].removeprefix("table ") for m in _reread(caplog) if what in m}
    assert reread == {f"{db}.t", f"{db}.other"}
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])


def test_a_table_held_by_one_pass_of_the_capture_is_let_go_by_the_last(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A capture that re-reads a table reads on in a second pass: the next starts the first pass
    held back for an XA transaction committed before the last pass ends are cleared, so the next
    run does not read the binlog since that transaction began again."""
    db = "chg_xa_pass"
    config = _setup_outside(mariadb, tmp_path, db)
    mariadb.execute(  # a row of `other`: the first pass holds it back where this began
        "XA START 'pass'",
        f"INSERT INTO {db}.other VALUES (9001, 'pass', 1)",
        "XA END 'pass'",
        "XA PREPARE 'pass'",
    )
    try:
        mariadb.execute(f"TRUNCATE TABLE {db}.t", f"INSERT INTO {db}.t VALUES (1, 'new', 1)")
        # the first pass ends, holds `other` back and re-reads t: stopped at its read
        assert config.path is not None
        proc = start_run(config.path, failpoint="read.batch_started:1:stop")
        wait_until_stopped(proc)
    finally:
        mariadb.execute("XA COMMIT 'pass'")
    os.kill(proc.pid, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    published = BinlogPosition.from_json(_manifest(config, f"{db}.t")["position"])
    assert _checkpoints(config)[f"{db}.other"] == published


def test_a_table_held_for_its_xa_transaction_is_not_read_again_for_what_its_version_has(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An XA transaction with a row of ``t`` stays prepared across runs, and a STATEMENT-format
    session changes ``t`` after it (docs/limits.md had it: each run re-read ``t``). The run that
    sees the change re-reads ``t``; the runs after it start ``t`` where the transaction began
    (to apply it at its commit) but keep nothing their version already has: no re-read, and the
    transaction's rows are published by the run that sees its commit."""
    db = "chg_xa_held"
    config = _setup(mariadb, tmp_path, db)
    _run(config)
    mariadb.execute(
        "XA START 'held'",
        f"INSERT INTO {db}.t VALUES (7001, 'xa held', 1)",
        f"UPDATE {db}.t SET v = 'xa held' WHERE id = 11",
        "XA END 'held'",
        "XA PREPARE 'held'",
    )
    try:
        mariadb.execute(
            "SET SESSION binlog_format = 'STATEMENT'",
            f"UPDATE {db}.t SET n = n + 1000 WHERE id BETWEEN 20 AND 40",
        )
        mariadb.execute(f"UPDATE {db}.t SET v = 'row format' WHERE id = 50")
        caplog.set_level(logging.INFO)
        _run(config)
        assert [m for m in _reread(caplog) if m.startswith(f"table {db}.t:")], _reread(caplog)
        assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
        published = BinlogPosition.from_json(_manifest(config, f"{db}.t")["position"])
        assert _checkpoints(config)[f"{db}.t"] < published  # held where the transaction began
        for round_ in range(2):
            caplog.clear()
            mariadb.execute(
                f"UPDATE {db}.t SET v = 'later {round_}' WHERE id = {60 + round_}",
                f"DELETE FROM {db}.t WHERE id = {70 + round_}",
                f"INSERT INTO {db}.other VALUES ({5000 + round_}, 'o', 1)",
            )
            _run(config)
            assert _reread(caplog) == []
            assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    finally:
        mariadb.execute("XA COMMIT 'held'")
    caplog.clear()
    _run(config)
    assert _reread(caplog) == []
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    published = BinlogPosition.from_json(_manifest(config, f"{db}.t")["position"])
    assert _checkpoints(config)[f"{db}.t"] == published
    rows = dict(mariadb.execute(f"SELECT id, v FROM {db}.t WHERE id IN (11, 7001)"))
    assert rows == {11: "xa held", 7001: "xa held"}


@pytest.mark.parametrize(
    "session",
    ["SET SESSION binlog_format = 'STATEMENT'", "SET SESSION binlog_row_image = 'MINIMAL'"],
    ids=["statement", "minimal_images"],
)
def test_a_change_without_row_images_inside_an_xa_transaction_counts_at_its_commit(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, session: str
) -> None:
    """A change the binlog holds no full row images of (a STATEMENT-format session's, or one
    logging minimal images), made inside an XA transaction, changes the table only when the
    transaction commits: a re-read before the commit (the transaction still prepared) cannot see
    it, so the table is re-read at the commit, in whichever run sees it; a rolled back one
    re-reads nothing. Before, the re-read came at once and the commit was published without it."""
    db = "chg_xa_stmt_" + session.split()[2][7:]
    config = _setup(mariadb, tmp_path, db)
    _run(config)
    for xid, rows in (("stmt_rb", "1 AND 9"), ("stmt", "20 AND 40")):
        mariadb.execute(
            session,
            f"XA START '{xid}'",
            f"UPDATE {db}.t SET n = n + 1000 WHERE id BETWEEN {rows}",
            f"XA END '{xid}'",
            f"XA PREPARE '{xid}'",
        )
    mariadb.execute("XA ROLLBACK 'stmt_rb'")
    try:
        mariadb.execute(f"UPDATE {db}.t SET v = 'row format' WHERE id = 50")
        caplog.set_level(logging.INFO)
        _run(config)
        assert _reread(caplog) == []  # nothing changed yet: the transaction is only prepared
        assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    finally:
        mariadb.execute("XA COMMIT 'stmt'")
    _run(config)
    assert [m for m in _reread(caplog) if m.startswith(f"table {db}.t:")], _reread(caplog)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    assert mariadb.execute(f"SELECT n FROM {db}.t WHERE id = 30") == [(30 % 97 + 1000,)]


def test_a_statement_read_from_the_binlog_is_shown_without_its_literals(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """An account statement's password and a statement-format change's literals stay out of
    ``tidemark run``'s output, its log file and the state store: the statement is named with its
    strings hidden. A user named like a run table (``other``) is no change of that table."""
    db = "chg_secrets"
    config = _setup(mariadb, tmp_path, db)
    _run(config)
    other_before = _stats(config, f"{db}.other")
    secret = "pw-8f3a-never-shown"
    try:
        mariadb.execute(
            f"CREATE USER other IDENTIFIED BY '{secret}'",
            f"ALTER USER other IDENTIFIED BY '{secret}-2'",
            "SET SESSION binlog_format = 'STATEMENT'",
            f"UPDATE t SET n = n + 1 WHERE v <> '{secret}' AND id <= 9",
            database=db,
        )
        run = start_run(tmp_path / "p.yaml")
        out, err = run.communicate(timeout=300)
    finally:
        mariadb.execute("DROP USER IF EXISTS other")

    assert run.returncode == 0, err
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    named = f"table {db}.t: a statement-format change `UPDATE t SET n = n + 1 WHERE v <> '***'"
    assert named in out + err, out + err
    assert secret not in out + err
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in written) and any(p.name == "state.db" for p in written)
    assert not [p for p in written if secret.encode() in p.read_bytes()]
    assert _stats(config, f"{db}.other") == other_before  # not re-read


VERSIONED = {
    "explicit": "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v VARCHAR(40), n INT,"
    " rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START, re TIMESTAMP(6) GENERATED ALWAYS AS ROW END,"
    " PERIOD FOR SYSTEM_TIME(rs, re)) WITH SYSTEM VERSIONING",
    "invisible": "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v VARCHAR(40), n INT,"
    " rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START INVISIBLE,"
    " re TIMESTAMP(6) GENERATED ALWAYS AS ROW END INVISIBLE,"
    " PERIOD FOR SYSTEM_TIME(rs, re)) WITH SYSTEM VERSIONING",
    "implicit": "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v VARCHAR(40), n INT)"
    " WITH SYSTEM VERSIONING",
    "keyless": "CREATE TABLE {db}.{name} (id INT, v VARCHAR(40), n INT) WITH SYSTEM VERSIONING",
}


@pytest.mark.parametrize("periods", list(VERSIONED))
def test_a_system_versioned_table_is_applied_as_its_current_rows(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, periods: str
) -> None:
    """An update or delete of a system-versioned table logs a history row (the old version,
    its period ended) beside the current one. Applied as rows, they made the lake hold the
    history (keyed by id and period end: every version of a row) while the source's table holds
    the current rows: a wrong table with exit 0, for explicit period columns; then the table was
    re-read whole at every change. Its rows events are applied as its current rows: the history
    rows left out, a row whose period ends deleted; the hidden period columns of a table that
    declares none are not published."""
    db = f"chg_versioned_{periods}"
    fill = FILL.replace("{name} SELECT", "{name} (id, v, n) SELECT")
    config = two_table_pipeline(mariadb, tmp_path, db, VERSIONED[periods], fill, (3000, 2000))
    _run(config)
    mariadb.execute(
        "UPDATE t SET n = n + 1000 WHERE id <= 20",
        "DELETE FROM t WHERE id BETWEEN 100 AND 110",
        "INSERT INTO t (id, v, n) VALUES (5001, 'new', 1)",
        "UPDATE t SET v = 'again' WHERE id = 1",
        "UPDATE t SET id = 6000 WHERE id = 30",  # a key change
        "REPLACE INTO t (id, v, n) VALUES (40, 'replaced', 4)",
        "INSERT INTO t (id, v, n) VALUES (41, 'x', 0) ON DUPLICATE KEY UPDATE n = 4141",
        "DELETE HISTORY FROM t BEFORE SYSTEM_TIME NOW(6)",
        database=db,
    )
    mariadb.execute(  # in one transaction: the row's history and its end, one after the other
        "BEGIN",
        "UPDATE t SET n = 1 WHERE id = 50",
        "UPDATE t SET n = 2 WHERE id = 50",
        "DELETE FROM t WHERE id = 50",
        "COMMIT",
        database=db,
    )
    caplog.set_level(logging.INFO)
    caplog.clear()
    _run(config)

    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    messages = [r.getMessage() for r in caplog.records]
    assert not any("re-read" in m or "snapshot," in m for m in messages), messages
    # 11 deleted, one inserted, one deleted in a transaction; keyless, REPLACE and ON DUPLICATE
    # KEY UPDATE insert a row each
    rows = 3000 - 11 + 1 - 1 + (2 if periods == "keyless" else 0)
    assert _manifest(config, f"{db}.t")["rows"] == rows
    assert _manifest(config, f"{db}.other")["version"] == 1
    published = [c["name"] for c in _manifest(config, f"{db}.t")["columns"]]
    assert published == (
        ["id", "v", "n"] if periods in ("implicit", "keyless") else ["id", "v", "n", "rs", "re"]
    )


def test_a_table_versioned_by_transaction_ids_is_re_read(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MariaDB logs a table whose periods are transaction ids as statements, whatever the
    session's binlog format: its changes re-read it."""
    db = "chg_versioned_trx"
    create = (
        "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v VARCHAR(40), n INT,"
        " rs BIGINT UNSIGNED GENERATED ALWAYS AS ROW START,"
        " re BIGINT UNSIGNED GENERATED ALWAYS AS ROW END,"
        " PERIOD FOR SYSTEM_TIME(rs, re)) ENGINE=InnoDB WITH SYSTEM VERSIONING"
    )
    fill = FILL.replace("{name} SELECT", "{name} (id, v, n) SELECT")
    config = two_table_pipeline(mariadb, tmp_path, db, create, fill, (300, 200))
    _run(config)
    mariadb.execute("UPDATE t SET n = n + 1000 WHERE id <= 20", database=db)
    caplog.set_level(logging.INFO)
    caplog.clear()
    _run(config)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    assert any("re-read" in r.getMessage() for r in caplog.records)


def test_compressed_columns_are_applied_from_the_binlog(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MariaDB's COMPRESSED columns come in the binlog as the server stores them (types 140 and
    141, a header byte, zlib): read, not re-read, in every way a session stores them (raw
    deflate or wrapped, under and over the threshold, empty, NULL, multi-byte text)."""
    db = "chg_compressed"
    create = (
        "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v VARCHAR(100) COMPRESSED, n INT,"
        " b TEXT COMPRESSED, vb VARBINARY(3000) COMPRESSED,"
        " u VARCHAR(400) CHARACTER SET utf8mb4 COMPRESSED, m MEDIUMBLOB COMPRESSED)"
    )
    fill = (
        "INSERT INTO {db}.{name} SELECT seq, REPEAT(CONCAT('row ', seq), seq % 12), seq % 97,"
        " REPEAT('t', seq % 400), REPEAT(X'00ff', seq % 900), REPEAT('é😀', seq % 190),"
        " IF(seq % 5 = 0, NULL, REPEAT('m', seq * 10)) FROM seq_1_to_{rows}"
    )
    config = two_table_pipeline(mariadb, tmp_path, db, create, fill, (1500, 500))
    _run(config)
    mariadb.execute(
        "UPDATE t SET v = 'short', b = REPEAT('z', 300), u = REPEAT('☃', 399) WHERE id <= 20",
        "INSERT INTO t VALUES (5001, '', 1, '', '', '', ''),"
        " (5002, NULL, 2, NULL, NULL, NULL, NULL)",
        "DELETE FROM t WHERE id BETWEEN 100 AND 110",
        database=db,
    )
    mariadb.execute(
        "SET SESSION column_compression_zlib_wrap = ON",
        "UPDATE t SET b = REPEAT('wrapped ', 100), m = REPEAT('mm', 40000)"
        " WHERE id BETWEEN 30 AND 40",
        database=db,
    )
    mariadb.execute(
        "SET SESSION column_compression_threshold = 0",
        "SET SESSION column_compression_zlib_level = 9",
        "UPDATE t SET v = 'ab', vb = X'00', u = 'ü' WHERE id BETWEEN 50 AND 60",
        database=db,
    )
    caplog.set_level(logging.INFO)
    caplog.clear()
    _run(config)

    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    assert not [r.getMessage() for r in caplog.records if "re-read" in r.getMessage()]
    assert _manifest(config, f"{db}.t")["version"] == 2
    assert _manifest(config, f"{db}.other")["version"] == 1


@pytest.mark.parametrize("metadata", ["NO_LOG", "MINIMAL", "FULL"])
def test_enum_labels_information_schema_cannot_print_are_read_by_the_server(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, metadata: str
) -> None:
    """information_schema (and SHOW CREATE TABLE) print an ENUM or SET label's four-byte
    characters as '?'. A binlog value is the label's index, so the binlog path published 'é?'
    where the source and the snapshot hold 'é😀' (with MINIMAL row metadata, and MariaDB's
    default NO_LOG: a wrong table with exit 0). Such a table's rows events re-read it unless the
    binlog's own labels are there to compare (FULL: they differ, so it is re-read too)."""
    db = f"chg_enum_labels_{metadata.lower()}"
    create = (
        "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, e ENUM('é😀', 'x') CHARACTER SET utf8mb4,"
        " s SET('?', '😀y') CHARACTER SET utf8mb4, n INT)"
    )
    fill = (
        "INSERT INTO {db}.{name} SELECT seq, IF(seq % 2, 'x', 'é😀'), '?', seq FROM seq_1_to_{rows}"
    )
    config = two_table_pipeline(mariadb, tmp_path, db, create, fill, (300, 200))
    _run(config)
    try:
        mariadb.execute(f"SET GLOBAL binlog_row_metadata = {metadata}")
        mariadb.execute(
            "INSERT INTO t VALUES (1001, 'é😀', '😀y,?', 1)",
            "UPDATE t SET e = 'é😀', s = '😀y' WHERE id <= 5",
            database=db,
        )
        caplog.set_level(logging.INFO)
        caplog.clear()
        _run(config)
    finally:
        mariadb.execute("SET GLOBAL binlog_row_metadata = FULL")
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    assert any(
        "column `e`" in r.getMessage() and r.getMessage().endswith(": re-read")
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
