"""Statements whose effect on a table is not in rows events, or not in their own words: each is
applied or makes its table read again, never skipped (found by a review, each reproduced with an
exit-0 run that published a table the source did not hold).

A plain snapshot of two tables, the statements, a second run: the lake equals the source.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import assert_lake_equals_source
from tests.integration.conftest import run_plain, two_table_pipeline

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v VARCHAR(40), n INT) ENGINE=InnoDB"
FILL = "INSERT INTO {db}.{name} SELECT seq, CONCAT('row ', seq), seq % 97 FROM seq_1_to_{rows}"

CASES: dict[str, tuple[list[str], list[str]]] = {
    # a transaction that also wrote a MyISAM table logs the rows a ROLLBACK TO undid
    "rollback to savepoint": (
        ["CREATE TABLE m (id INT PRIMARY KEY) ENGINE=MyISAM"],
        [
            "BEGIN",
            "UPDATE t SET v = 'kept' WHERE id = 1",
            "SAVEPOINT s",
            "DELETE FROM t WHERE id = 2",
            "INSERT INTO t VALUES (6000, 'undone', 0)",
            "INSERT INTO m VALUES (1)",
            "ROLLBACK TO SAVEPOINT s",
            "COMMIT",
        ],
    ),
    # MariaDB's per-statement settings prefix the statement in the binlog
    "set statement for truncate": (
        [],
        ["SET STATEMENT max_statement_time=100 FOR TRUNCATE TABLE t"],
    ),
    "set statement for a statement-format delete": (
        [],
        [
            "SET SESSION binlog_format = STATEMENT",
            "SET STATEMENT max_statement_time=100 FOR DELETE FROM t WHERE id < 5",
        ],
    ),
    # LOAD DATA in STATEMENT format is an EXECUTE_LOAD_QUERY event, not a QUERY event
    "load data as a statement": (
        [],
        ["SET SESSION binlog_format = STATEMENT", "LOAD DATA LOCAL INFILE '{data}' INTO TABLE t"],
    ),
    # a stored function's writes are logged as the SELECT that called it
    "a function that writes": (
        [
            "CREATE FUNCTION f() RETURNS INT DETERMINISTIC MODIFIES SQL DATA "
            "BEGIN DELETE FROM t WHERE id <= 5; RETURN 1; END"
        ],
        ["SET SESSION binlog_format = MIXED", "SELECT f()"],
    ),
    # a session's ANSI_QUOTES: "t" names a table (read as a string, the swap named none)
    "ansi quotes rename swap": (
        [
            "CREATE TABLE t2 LIKE t",
            "INSERT INTO t2 SELECT id + 1000, 'swapped in', n FROM t WHERE id <= 7",
        ],
        ["SET SESSION sql_mode = 'ANSI_QUOTES'", 'RENAME TABLE "t" TO "t_old", "t2" TO "t"'],
    ),
    # a session's NO_BACKSLASH_ESCAPES: 'C:\' is a whole string (the statement named no table)
    "no backslash escapes replace": (
        [],
        [
            "SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'",
            "CREATE OR REPLACE TABLE t (id INT PRIMARY KEY, v VARCHAR(40) DEFAULT 'C:\\', n INT)",
            "INSERT INTO t (id, n) VALUES (1, 1)",
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_statement_is_applied_or_its_tables_read_again(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object, case: str
) -> None:
    setup, statements = CASES[case]
    db = "stmt_" + "".join(c for c in case if c.isalnum())[:20]
    config = two_table_pipeline(mariadb, tmp_path, db, TABLE, FILL, (50, 20))
    if setup:
        mariadb.execute(*setup, database=db)
    run_plain(config)
    data = tmp_path / "rows.txt"
    data.write_text("5001\tloaded\t5\n5002\tloaded\t6\n")
    mariadb.execute("SET GLOBAL local_infile = 1")
    conn = mariadb.connect(database=db, local_infile=True)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement.format(data=data))
    finally:
        conn.close()
    run_plain(config)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
