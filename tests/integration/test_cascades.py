"""Foreign-key cascades reach the lake (docs/design.md, "Foreign-key cascades").

MariaDB's InnoDB runs ``ON DELETE``/``ON UPDATE`` ``CASCADE`` and ``SET NULL`` inside the
engine and writes no row event for the child rows it changes; Tidemark derives them from the
parents' row events. Each test changes parents between (or during) runs on the private MariaDB
and ends with every table equal to the source through its manifest, pyiceberg and DuckDB
(`tests.iceberg_readers`). Before the derivation, each of them kept the child rows the source
deleted or changed through their parent.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.doctor import run_checks
from orchestrator.app.plan import plan_command
from orchestrator.config import PipelineConfig, load_config
from orchestrator.pipeline.failed import TablesFailed
from tests.conftest import fresh_database, load_pipeline, pipeline_config, start_run, write_config
from tests.iceberg_readers import assert_readers_equal_source
from tests.integration.conftest import run_plain
from tests.integration.test_failures import wait_until_stopped

pytestmark = pytest.mark.integration


def pipeline(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    db: str,
    statements: list[str],
    tables: list[str],
    **defaults: Any,
) -> PipelineConfig:
    """Database ``db`` made anew by ``statements``, and a pipeline of ``tables`` in it."""
    fresh_database(mariadb, db, *statements)
    return load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{db}.{t}"} for t in tables],
        name=db,
        defaults={"read_margin_seconds": 0.0, **defaults},
    )


def equal(config: PipelineConfig, db: str, tables: list[str]) -> None:
    assert_readers_equal_source(config, [f"{db}.{t}" for t in tables])


def in_statement_format(mariadb: LocalMariaDB, db: str, *statements: str) -> None:
    """``statements`` in ``db`` by a session logging in STATEMENT format: no row images."""
    mariadb.execute("SET SESSION binlog_format = 'STATEMENT'", *statements, database=db)


FAMILY = [
    "CREATE TABLE p (id INT PRIMARY KEY, name VARCHAR(20))",
    "CREATE TABLE c (id INT PRIMARY KEY, pid INT, note VARCHAR(20),"
    " CONSTRAINT c_p FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE g (id INT PRIMARY KEY, cid INT, w INT,"
    " CONSTRAINT g_c FOREIGN KEY (cid) REFERENCES c (id) ON DELETE SET NULL)",
    "INSERT INTO p SELECT seq, CONCAT('p', seq) FROM seq_1_to_40",
    "INSERT INTO c SELECT seq, 1 + seq % 40, CONCAT('c', seq) FROM seq_1_to_400",
    "INSERT INTO g SELECT seq, 1 + seq % 400, seq FROM seq_1_to_800",
]


def test_delete_update_and_set_null_cascades_three_levels(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: parents deleted and re-keyed, children (ON DELETE CASCADE ON UPDATE
    CASCADE) and grandchildren (ON DELETE SET NULL) all in the pipeline, between runs."""
    db = "casc_family"
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, FAMILY, tables)
    run_plain(config)
    mariadb.execute(
        "DELETE FROM p WHERE id <= 10",  # 100 children deleted, 200 grandchildren set null
        "UPDATE p SET id = id + 1000 WHERE id BETWEEN 11 AND 20",  # 100 children re-pointed
        "UPDATE c SET note = 'own change' WHERE id % 40 = 21",  # own changes among them
        database=db,
    )
    caplog.set_level(logging.WARNING)
    run_plain(config)
    equal(config, db, tables)
    assert "re-read" not in caplog.text  # derived, not read again


def test_a_child_without_a_key_is_read_again_after_a_cascade(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A child with no key (published as the multiset of its rows) cannot take derived records:
    a cascade into it re-reads it, saying why, and the lake still equals the source."""
    db = "casc_keyless"
    statements = [
        "CREATE TABLE p (id INT PRIMARY KEY, name VARCHAR(20))",
        "CREATE TABLE log (pid INT, what VARCHAR(20),"
        " CONSTRAINT log_p FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE)",
        "INSERT INTO p SELECT seq, CONCAT('p', seq) FROM seq_1_to_20",
        "INSERT INTO log SELECT 1 + seq % 20, 'same' FROM seq_1_to_200",  # identical rows
    ]
    config = pipeline(mariadb, tmp_path, db, statements, ["p", "log"])
    run_plain(config)
    mariadb.execute("DELETE FROM p WHERE id <= 5", database=db)
    caplog.set_level(logging.INFO)
    run_plain(config)
    equal(config, db, ["p", "log"])
    assert "has no key: its rows are a multiset" in caplog.text


def test_a_self_referencing_tree_loses_whole_subtrees(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Deleting a node deletes its subtree, level after level, inside one table."""
    db = "casc_tree"
    tree = [
        "CREATE TABLE t (id INT PRIMARY KEY, parent INT, label VARCHAR(20),"
        " CONSTRAINT t_up FOREIGN KEY (parent) REFERENCES t (id) ON DELETE CASCADE)",
        "INSERT INTO t VALUES (1, NULL, 'root')",
        "INSERT INTO t SELECT seq, seq DIV 2, CONCAT('n', seq) FROM seq_2_to_2000",  # 11 levels
    ]
    config = pipeline(mariadb, tmp_path, db, tree, ["t"])
    run_plain(config)
    mariadb.execute(
        "UPDATE t SET label = 'moved', parent = 6 WHERE id = 70",  # a subtree moved under 3
        "DELETE FROM t WHERE id IN (3, 41, 400)",
        database=db,
    )
    run_plain(config)
    equal(config, db, ["t"])


COMPOSITE = [
    "CREATE TABLE cp (a INT, b VARCHAR(8) COLLATE utf8mb4_bin, name VARCHAR(10),"
    " PRIMARY KEY (a, b))",
    "CREATE TABLE cc (a INT, b VARCHAR(8) COLLATE utf8mb4_bin, n INT, v INT,"
    " PRIMARY KEY (a, b, n), CONSTRAINT cc_cp FOREIGN KEY (a, b) REFERENCES cp (a, b)"
    " ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE gc (id INT PRIMARY KEY, a INT, b VARCHAR(8) COLLATE utf8mb4_bin, n INT,"
    " CONSTRAINT gc_cc FOREIGN KEY (a, b, n) REFERENCES cc (a, b, n)"
    " ON DELETE SET NULL ON UPDATE CASCADE)",
    "INSERT INTO cp SELECT seq, CONCAT('k', seq % 3), 'x' FROM seq_1_to_30",
    "INSERT INTO cc SELECT a, b, seq, seq FROM cp JOIN seq_1_to_5",
    "INSERT INTO gc SELECT ROW_NUMBER() OVER (), a, b, n FROM cc",
]


def test_a_composite_key_whose_cascade_changes_the_childs_own_key(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """An ON UPDATE CASCADE into a child whose primary key holds the foreign key: the child's
    key changes (its old key deleted), and its own child follows it."""
    db = "casc_composite"
    tables = ["cp", "cc", "gc"]
    config = pipeline(mariadb, tmp_path, db, COMPOSITE, tables)
    run_plain(config)
    mariadb.execute(
        "UPDATE cp SET b = CONCAT(b, 'x') WHERE a <= 5",
        "UPDATE cp SET a = a + 100 WHERE a BETWEEN 6 AND 8",
        "DELETE FROM cp WHERE a IN (9, 10)",
        database=db,
    )
    run_plain(config)
    equal(config, db, tables)


def test_a_parent_outside_the_pipeline(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """The parent is not a table of the run: its rows events are captured, never published."""
    db = "casc_outside"
    config = pipeline(mariadb, tmp_path, db, FAMILY, ["c", "g"])
    run_plain(config)
    mariadb.execute(
        "DELETE FROM p WHERE id IN (3, 4, 5)",
        "UPDATE p SET id = 500 WHERE id = 6",
        database=db,
    )
    run_plain(config)
    equal(config, db, ["c", "g"])
    assert not (tmp_path / "lake" / db / "p").exists()


def test_a_session_without_foreign_key_checks_cascades_nothing(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """``foreign_key_checks=0``: the engine runs no action and the children keep pointing at
    deleted parents, in the source and so in the lake; another session's delete cascades."""
    db = "casc_unchecked"
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, FAMILY, tables)
    run_plain(config)
    conn = mariadb.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION foreign_key_checks = 0")
            cur.execute("DELETE FROM p WHERE id IN (1, 2)")
            cur.execute("UPDATE p SET id = 900 WHERE id = 3")
            cur.execute("SET SESSION foreign_key_checks = 1")
            cur.execute("DELETE FROM p WHERE id = 4")
        conn.commit()
    finally:
        conn.close()
    assert mariadb.execute(f"SELECT COUNT(*) FROM {db}.c WHERE pid IN (1, 2, 3)")[0][0] == 30
    run_plain(config)
    equal(config, db, tables)


def test_a_cascade_in_an_xa_transaction_counts_at_its_commit(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    db = "casc_xa"
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, FAMILY, tables)
    run_plain(config)
    mariadb.execute(
        "XA START 'casc'",
        "DELETE FROM p WHERE id IN (7, 8)",
        "UPDATE p SET id = 700 WHERE id = 9",
        "XA END 'casc'",
        "XA PREPARE 'casc'",
        "XA COMMIT 'casc'",
        database=db,
    )
    run_plain(config)
    equal(config, db, tables)


def test_a_statement_format_cascade_re_reads_the_children(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, spark: object
) -> None:
    """A parent changed by a STATEMENT-format session: its cascades are in no row event at all,
    so the parent and every table below it are read again."""
    db = "casc_statement"
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, FAMILY, tables)
    run_plain(config)
    conn = mariadb.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION binlog_format = 'STATEMENT'")
            cur.execute("DELETE FROM p WHERE id IN (11, 12)")
        conn.commit()
    finally:
        conn.close()
    caplog.set_level(logging.WARNING)
    run_plain(config)
    equal(config, db, tables)
    for table in tables:
        assert f"table {db}.{table}: " in caplog.text and "re-read" in caplog.text


@pytest.mark.parametrize(
    ("held", "between"), [("p", False), ("outside", True)], ids=["the-parent", "held-back"]
)
def test_a_statement_format_cascade_with_an_xa_transaction_prepared_is_re_read_once(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    held: str,
    between: bool,
) -> None:
    """The same with an XA transaction prepared before the statement and not committed at the
    run's end: of the parent itself, or of a table outside the pipeline prepared across the run
    before (which holds every table's start back where it began). The capture's checkpoint stays
    where the transaction began, so the pass after the re-read reads the statement again. The
    parent's start, lowered to the pass's earliest (``other``'s, not re-read) for the cascades of
    its rows before it, must not count for its own re-read: before, the parent was re-read at
    the same statement in each pass and failed after three ("it changed again during each of 3
    re-reads")."""
    db = f"casc_statement_xa_{held}"
    tables = ["p", "c", "g"]
    family = [
        *FAMILY,
        "CREATE TABLE outside (id INT)",
        "CREATE TABLE other (id INT PRIMARY KEY)",
        "INSERT INTO other VALUES (1), (2)",
    ]
    config = pipeline(mariadb, tmp_path, db, family, [*tables, "other"])
    run_plain(config)
    row = (
        "UPDATE p SET name = 'xa' WHERE id = 1" if held == "p" else "INSERT INTO outside VALUES (1)"
    )
    mariadb.execute("XA START 'wait'", f"USE {db}", row, "XA END 'wait'", "XA PREPARE 'wait'")
    try:
        if between:
            run_plain(config)
        in_statement_format(mariadb, db, "DELETE FROM p WHERE id IN (11, 12)")
        caplog.set_level(logging.WARNING)
        caplog.clear()
        run_plain(config)
        equal(config, db, [*tables, "other"])
        rereads = [r.getMessage() for r in caplog.records if r.getMessage().endswith(": re-read")]
        assert sorted(line.split(":")[0] for line in rereads) == [
            f"table {db}.{t}" for t in sorted(tables)
        ], rereads
    finally:
        mariadb.execute("XA COMMIT 'wait'")
    run_plain(config)
    equal(config, db, [*tables, "other"])


def _parent_held_then_lost(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    db: str,
    lose: list[str],
    columns: str = "",
    fails: bool = False,
) -> PipelineConfig:
    """``p`` -> ``c`` (ON DELETE CASCADE) and ``other``; an XA transaction with a row of ``p``
    prepared across a run's end, so the next run starts ``p`` where it began, before ``c``'s
    start; ``lose`` (run on one connection) between the XA's begin and that run's end makes
    ``p`` stop being known there; then a row-format delete of ``p`` after ``c``'s start, and
    the commit. Returns the pipeline; the caller runs it."""
    config = pipeline(
        mariadb,
        tmp_path,
        db,
        [
            f"CREATE TABLE p (id INT PRIMARY KEY, v INT{columns})",
            "CREATE TABLE c (id INT PRIMARY KEY, pid INT,"
            " CONSTRAINT c_p FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE)",
            "CREATE TABLE other (id INT PRIMARY KEY)",
            "INSERT INTO p (id, v) SELECT seq, seq FROM seq_1_to_20",
            "INSERT INTO c SELECT seq, 1 + seq % 20 FROM seq_1_to_60",
            "INSERT INTO other VALUES (1)",
        ],
        ["p", "c", "other"],
    )
    run_plain(config)
    mariadb.execute(
        "XA START 'held'",
        f"UPDATE {db}.p SET v = 0 WHERE id = 1",
        "XA END 'held'",
        "XA PREPARE 'held'",
    )
    try:
        mariadb.execute(*lose, database=db)
        if fails:  # `lose` fails p: the next run retries it from its version, before `lose`
            with pytest.raises(TablesFailed):
                run_plain(config)
        else:
            run_plain(config)  # p is held back to the transaction's begin, before `lose`
        mariadb.execute("DELETE FROM p WHERE id = 7", database=db)  # cascades into c
    finally:
        mariadb.execute("XA COMMIT 'held'")
    return config


def test_a_parent_re_read_before_its_childs_start_still_cascades_into_it(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A parent started before its child (held back for an XA transaction) and re-read at a
    statement between the two starts: from there its rows events are not decoded, so the
    child, which started after the statement, would miss the cascades of the parent's later
    deletes. Every run table still captured below such a parent is re-read with it. Before,
    the run exited 0 with the child keeping the three rows the delete of parent 7 cascaded
    away."""
    db = "casc_lost_parent"
    lose = ["SET SESSION binlog_format = 'STATEMENT'", "DELETE FROM p WHERE id = 2"]
    config = _parent_held_then_lost(mariadb, tmp_path, db, lose)
    run_plain(config)
    assert mariadb.execute(f"SELECT COUNT(*) FROM {db}.c WHERE pid IN (2, 7)") == [(0,)]
    equal(config, db, ["p", "c", "other"])


def test_a_parent_failed_before_its_childs_start_still_cascades_into_it(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """The same with a parent that fails on its own (a POINT of another SRID than its column
    declares): the child is re-read, not left without the cascades of the parent's rows after
    the failure. The run ends partial, naming the parent alone. (This case re-read the child
    before `reread.stopped` too; it guards the failure's path to the same rule.)"""
    db = "casc_failed_parent"
    good, bad = "ST_GeomFromText('POINT(1 1)', 4326)", "ST_GeomFromText('POINT(1 1)', 0)"
    lose = [f"UPDATE p SET g = {bad} WHERE id = 3"]
    config = _parent_held_then_lost(
        mariadb,
        tmp_path,
        db,
        lose,
        columns=f", g POINT REF_SYSTEM_ID=4326 DEFAULT ({good})",
        fails=True,
    )
    with pytest.raises(TablesFailed) as partial:
        run_plain(config)
    assert set(partial.value.failed) == {f"{db}.p"}, partial.value.failed
    assert mariadb.execute(f"SELECT COUNT(*) FROM {db}.c WHERE pid = 7") == [(0,)]
    equal(config, db, ["c", "other"])


def test_a_cascade_into_a_child_re_read_by_the_driver_inside_the_run(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A child re-read inside an incremental run (a STATEMENT-format change of its own) is a
    snapshot of one chunk the driver read: its chunk's path is that one Parquet file, not a
    directory of Spark's part files. A parent's delete after that read, inside the run,
    cascades into the child from those rows. Before, listing the path as a directory failed
    the run, and every rerun the same way ("a parent of the path is a regular file")."""
    db = "casc_driver_reread"
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, FAMILY, tables)
    run_plain(config)
    in_statement_format(mariadb, db, "UPDATE c SET note = 'st' WHERE id < 5")
    assert config.path is not None
    proc = start_run(config.path, failpoint="read.batch_done:1:stop")  # c's re-read, read
    wait_until_stopped(proc)
    try:
        mariadb.execute("DELETE FROM p WHERE id = 9", database=db)  # before the run's new H
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert mariadb.execute(f"SELECT COUNT(*) FROM {db}.c WHERE pid = 9") == [(0,)]
    equal(config, db, tables)


class _Writer(threading.Thread):
    """Deletes parents, changes their keys, adds parents with children and changes children,
    until stopped: cascades land anywhere in the snapshot's reads, before and after each."""

    def __init__(self, mariadb: LocalMariaDB, db: str) -> None:
        super().__init__(daemon=True)
        self.mariadb, self.db = mariadb, db
        self.stop = threading.Event()
        self.done = 0

    def run(self) -> None:
        rng = random.Random(32)
        conn = self.mariadb.connect(database=self.db)
        fresh = 10_000
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    match self.done % 4:
                        case 0:
                            cur.execute("DELETE FROM p WHERE id = %s", (rng.randint(1, 400),))
                        case 1:
                            fresh += 1
                            cur.execute(
                                "UPDATE p SET id = %s WHERE id = %s", (fresh, rng.randint(1, 400))
                            )
                        case 2:
                            fresh += 1
                            cur.execute("INSERT INTO p VALUES (%s, 'new')", (fresh,))
                            cur.execute(
                                "INSERT INTO c SELECT %s * 100 + seq, %s, 'new' FROM seq_1_to_5",
                                (fresh, fresh),
                            )
                        case 3:
                            cur.execute(
                                "UPDATE c SET note = 'own' WHERE id = %s", (rng.randint(1, 4000),)
                            )
                    conn.commit()
                    self.done += 1
                    time.sleep(0.005)
        finally:
            conn.close()


@pytest.mark.slow
def test_cascades_inside_the_snapshot_window_under_concurrent_writers(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """A writer deletes and re-keys parents while the three tables are snapshotted in many
    chunks and batches (Spark's reads): each cascade lands before, inside or after some chunk's
    read. The run's result, caught up by one more run after the writer stopped, equals the
    source."""
    db = "casc_window"
    family = [
        *FAMILY[:3],
        "INSERT INTO p SELECT seq, CONCAT('p', seq) FROM seq_1_to_400",
        "INSERT INTO c SELECT seq, 1 + seq % 400, CONCAT('c', seq) FROM seq_1_to_4000",
        "INSERT INTO g SELECT seq, 1 + seq % 4000, seq FROM seq_1_to_8000",
    ]
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, family, tables, chunk_size=500, batch_chunks=2)
    writer = _Writer(mariadb, db)
    writer.start()
    try:
        run_plain(config)
    finally:
        writer.stop.set()
        writer.join()
    assert writer.done > 50, "the writer made too few changes to test anything"
    run_plain(config)
    equal(config, db, tables)


TEXT_KEYS = [
    "CREATE TABLE country (code VARCHAR(3) COLLATE utf8mb4_general_ci PRIMARY KEY)",
    "CREATE TABLE city (id INT PRIMARY KEY, country VARCHAR(3) COLLATE utf8mb4_general_ci,"
    " CONSTRAINT city_country FOREIGN KEY (country) REFERENCES country (code)"
    " ON DELETE CASCADE ON UPDATE CASCADE)",
    "INSERT INTO country VALUES ('fr'), ('de'), ('it')",
    "INSERT INTO city SELECT seq, ELT(1 + seq % 3, 'FR', 'de', 'It') FROM seq_1_to_30",
]


def test_a_key_compared_in_a_collation_re_reads_its_child_saying_why(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, spark: object
) -> None:
    """``'FR'`` references ``'fr'`` under utf8mb4_general_ci: Tidemark does not evaluate the
    collation, so a cascade through that key re-reads the child, logged with the reason."""
    db = "casc_collation"
    config = pipeline(mariadb, tmp_path, db, TEXT_KEYS, ["country", "city"])
    run_plain(config)
    mariadb.execute("DELETE FROM country WHERE code = 'fr'", database=db)
    caplog.set_level(logging.WARNING)
    run_plain(config)
    equal(config, db, ["country", "city"])
    assert f"table {db}.city: a foreign-key cascade (a delete of {db}.country" in caplog.text
    assert "compares text in collation utf8mb4_general_ci" in caplog.text


def test_doctor_and_plan_list_the_cascading_keys(
    mariadb: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = "casc_doctor"
    config = pipeline(mariadb, tmp_path, db, [*FAMILY[:3], *TEXT_KEYS[:2]], ["c", "g", "city"])
    lines = {c.name: c.detail for c in run_checks(config)}
    assert (
        "writes no row event for the child rows its cascades change"
        in (lines["foreign-key cascades"])
    )
    assert lines[f"cascade {db}.c.c_p"] == (
        f"{db}.c (pid) -> {db}.p (id) ON DELETE CASCADE ON UPDATE CASCADE: derived; {db}.p is "
        "not in the pipeline: its row events are read for the cascades, never published"
    )
    assert lines[f"cascade {db}.g.g_c"].endswith("ON DELETE SET NULL ON UPDATE RESTRICT: derived")
    assert "re-read when it cascades" in lines[f"cascade {db}.city.city_country"]
    assert plan_command(config, [], as_json=True) == 0
    cascades = json.loads(capsys.readouterr().out)["cascades"]
    assert cascades["mode"] == "derive"
    keys = {k["name"]: k for k in cascades["keys"]}
    assert set(keys) == {"c_p", "g_c", "city_country"}
    assert keys["c_p"]["derived"] and keys["c_p"]["outside_pipeline"] == [f"{db}.p"]
    assert not keys["city_country"]["derived"] and keys["city_country"]["outside_pipeline"] == [
        f"{db}.country"
    ]


def test_a_parent_the_user_cannot_see_fails_its_child_naming_the_grant(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Without SELECT on a parent outside the pipeline its row events cannot be decoded, so the
    cascades from it (into ``c``, and through ``c`` into ``g``) cannot be followed: doctor fails
    both and a run leaves them out, saying which grant is missing."""
    db = "casc_grants"
    config = pipeline(mariadb, tmp_path, db, FAMILY, ["c", "g"])
    mariadb.execute(
        "CREATE USER IF NOT EXISTS 'tm_casc'@'%' IDENTIFIED BY 'casc-pass'",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'tm_casc'@'%'",
        f"GRANT SELECT ON {db}.c TO 'tm_casc'@'%'",
        f"GRANT SELECT ON {db}.g TO 'tm_casc'@'%'",
    )
    data = pipeline_config(
        tmp_path,
        mariadb,
        [{"name": f"{db}.c"}, {"name": f"{db}.g"}],
        name=db,
        defaults={"read_margin_seconds": 0.0},
    )
    data["source"] = mariadb.source_config("tm_casc", "casc-pass")
    config = load_config(write_config(tmp_path / "p.yaml", data))
    failed = {c.name: c for c in run_checks(config) if not c.ok}
    assert set(failed) == {f"cascades {db}.c", f"cascades {db}.g"}, failed
    assert "grant it SELECT there" in failed[f"cascades {db}.c"].detail
    with pytest.raises(TablesFailed) as partial:
        run_plain(config)
    assert set(partial.value.failed) == {f"{db}.c", f"{db}.g"}
    assert f"keys' rules of {db}.p: grant it SELECT" in partial.value.failed[f"{db}.c"]["reason"]


def test_a_key_referencing_a_unique_column_that_is_not_the_parents_key(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """The parent's referenced column is a unique key besides its primary key: an update's old
    value is in the rows event's before image only, which the capture decodes for it."""
    db = "casc_unique"
    statements = [
        "CREATE TABLE p (id INT PRIMARY KEY, code INT NOT NULL, UNIQUE KEY u_code (code))",
        "CREATE TABLE c (id INT PRIMARY KEY, pcode INT, CONSTRAINT c_code FOREIGN KEY (pcode)"
        " REFERENCES p (code) ON UPDATE CASCADE ON DELETE SET NULL)",
        "INSERT INTO p SELECT seq, 1000 + seq FROM seq_1_to_20",
        "INSERT INTO c SELECT seq, 1000 + 1 + seq % 20 FROM seq_1_to_200",
    ]
    config = pipeline(mariadb, tmp_path, db, statements, ["p", "c"])
    run_plain(config)
    mariadb.execute(
        "UPDATE p SET code = code + 5000 WHERE id <= 5",
        "DELETE FROM p WHERE id IN (6, 7)",
        database=db,
    )
    run_plain(config)
    equal(config, db, ["p", "c"])


@pytest.mark.parametrize(
    ("held", "rows"),
    [("outside", [(1, 11), (2, 10)]), ("c", [(1, 11), (2, 10), (3, None)])],
    ids=["a-table-outside", "the-child"],
)
def test_a_child_held_back_for_an_xa_transaction_derives_from_its_version_exactly(
    mariadb: LocalMariaDB, tmp_path: Path, held: str, rows: list[tuple[int, int | None]]
) -> None:
    """An XA transaction prepared across a run's end, of a table outside the pipeline or of the
    child itself, holds the child's next start back where it began: the next run reads the
    parents' changes before the child's published version again. The child's base is then its
    rows at that version, after those changes, not at its start: a parent re-keyed to a value an
    earlier cascade took away (12 -> 10 after 10 -> 11) must not be derived from the base's later
    rows (child 2 has pid 10 only from the second cascade), so the child is read again
    (docs/design.md, "Foreign-key cascades"), and the lake equals the source. Before, child 2
    was published with pid 11 (the first cascade derived on it), the run exiting 0."""
    db = f"casc_held_{held}"
    config = pipeline(
        mariadb,
        tmp_path,
        db,
        [
            "CREATE TABLE p (id INT PRIMARY KEY)",
            "CREATE TABLE c (id INT PRIMARY KEY, pid INT,"
            " CONSTRAINT c_p FOREIGN KEY (pid) REFERENCES p (id) ON UPDATE CASCADE)",
            "CREATE TABLE outside (id INT PRIMARY KEY)",
            "INSERT INTO p VALUES (10), (12)",
            "INSERT INTO c VALUES (1, 10), (2, 12)",
        ],
        ["p", "c"],
    )
    run_plain(config)
    mariadb.execute(
        "XA START 'held'",
        f"INSERT INTO {db}.{held} VALUES (3{', NULL' if held == 'c' else ''})",
        "XA END 'held'",
        "XA PREPARE 'held'",
    )
    try:
        mariadb.execute(
            "UPDATE p SET id = 11 WHERE id = 10", "UPDATE p SET id = 10 WHERE id = 12", database=db
        )
        run_plain(config)  # ends with the transaction prepared: p and c held back
        equal(config, db, ["p", "c"])
    finally:
        mariadb.execute("XA COMMIT 'held'")
    run_plain(config)  # reads the two updates again, the child's version already after them
    assert mariadb.execute(f"SELECT id, pid FROM {db}.c ORDER BY id") == rows
    equal(config, db, ["p", "c"])


def test_a_parent_whose_read_a_ddl_failed_is_re_read_with_its_children(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column of the parent dropped before its snapshot read, so that read fails: the parent
    is re-read inside the run (docs/design.md, "Changes that are not row images"). Parents
    deleted after every read, before ``H``, cascade into children read before: the capture
    sees the parent's DDL before its new start, and re-reads the run tables below it, which
    started before that DDL. Every table equals the source; before, the parent failed and the
    run ended partial."""
    from orchestrator.pipeline.capture import passes as capture_module
    from orchestrator.pipeline.read import step as read_module

    db = "casc_read_ddl"
    tables = ["p", "c", "g"]
    config = pipeline(mariadb, tmp_path, db, FAMILY, tables)
    real_read, real_rereads = read_module._read_tables, capture_module.prepare_rereads
    lock, done = threading.Lock(), []

    def drop_first(*args: Any, **kwargs: Any) -> Any:
        with lock:  # batches are read side by side
            if not done:
                mariadb.execute("ALTER TABLE p DROP COLUMN name", database=db)
                done.append("alter")
        return real_read(*args, **kwargs)

    def delete_first(*args: Any, **kwargs: Any) -> bool:
        if "delete" not in done:  # after every read batch, before H is recorded
            mariadb.execute("DELETE FROM p WHERE id IN (3, 9)", database=db)
            done.append("delete")
        return real_rereads(*args, **kwargs)

    monkeypatch.setattr(read_module, "_read_tables", drop_first)
    monkeypatch.setattr(capture_module, "prepare_rereads", delete_first)
    run_plain(config)
    assert done == ["alter", "delete"]
    assert mariadb.execute(f"SELECT COUNT(*) FROM {db}.c WHERE pid IN (3, 9)") == [(0,)]
    equal(config, db, tables)
