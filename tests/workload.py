"""A seeded random mix of the writes a source sees, for checking that runs apply them exactly.

One database of seventeen tables, each there for a family of changes the binlog carries, or hides:

- ``p``, ``c``, ``g``, ``c2``, ``f``: foreign keys (``ON DELETE``/``ON UPDATE`` ``CASCADE`` two
  levels down, ``SET NULL``), with parent deletes and key changes in row and statement format
  (the engine's cascades are in no row event); ``f`` is configured with a ``where``;
- ``k``: a composite key with a case-insensitive text part (case-only key changes, REPLACE,
  a MIXED-format session);
- ``u``: BIGINT UNSIGNED key, DECIMAL, DATETIME(3), ENUM; columns added and dropped, an upsert;
- ``big``: range updates and deletes, a STATEMENT-format update, a session with
  ``binlog_row_image=MINIMAL``, a column retyped;
- ``nk``: no key at all;
- ``ci``: a text key in ``utf8mb4_general_ci`` changed in case and trailing spaces, rebuilt by
  OPTIMIZE; its ``note`` a MariaDB COMPRESSED TEXT (stored as it is under 100 bytes, zlib over);
- ``j``: JSON, BLOB and POINT values, also from a session with ``binlog_row_image=NOBLOB``;
- ``dk``, ``dt``, ``bn``: DECIMAL, DATETIME(6) and BINARY(16) keys, changed (``dt`` also from a
  MINIMAL-image session; ``j``, ``dt``, ``bn`` and ``nk`` see no DDL or statement-format write,
  whose re-read would hide a rows event mishandled before it); a statement-format
  ``INSERT ... SELECT`` into ``dk``;
- ``m``: a column renamed, one added in the middle, an ENUM extended, a multi-table update in
  statement format, a multi-table delete;
- ``tg``: written by triggers on ``nk`` and by a stored procedure (row format: their writes
  are row events); ``dk`` loses and regains its primary key.

And ``xo``, outside the pipeline, which only XA transactions write.

`Workload.write` applies a number of random operations (a fifth of them two to a transaction,
some rolled back); `Workload.turn_xa` ends the XA transaction it left prepared and may prepare
another across the next run. Used by tests/integration/test_random_workload.py (fixed seeds,
writes between runs and during them) and by tests/stress.py (any seed, any length, runs killed).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql

from orchestrator.app.demo.localdb import LocalMariaDB

#: Server errors a random operation may meet and that leave the data as it was: a duplicate
#: key, a foreign key refusing, a lock wait or deadlock with the writer thread, a table or column
#: renamed away by another operation meanwhile, a column already gone.
EXPECTED_ERRORS = frozenset({1054, 1060, 1062, 1091, 1146, 1205, 1213, 1451, 1452})

#: The server's answer to ending an XA transaction it rolled back itself.
XA_RBROLLBACK = 1402

TABLES = (
    "p",
    "c",
    "g",
    "c2",
    "f",
    "k",
    "u",
    "big",
    "nk",
    "ci",
    "j",
    "r",
    "dk",
    "dt",
    "bn",
    "m",
    "tg",
)

#: The ``where`` of the filtered table (its other rows stay out of the lake).
FILTERS = {"f": "s < 3"}

SCHEMA = (
    "CREATE TABLE xo (id INT PRIMARY KEY, v INT)",  # outside the pipeline: XA transactions
    "CREATE TABLE p (id INT PRIMARY KEY, v INT, s VARCHAR(20))",
    "CREATE TABLE c (id INT PRIMARY KEY, pid INT, v INT, FOREIGN KEY (pid) REFERENCES p (id)"
    " ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE g (id INT PRIMARY KEY, cid INT, FOREIGN KEY (cid) REFERENCES c (id)"
    " ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE c2 (id INT PRIMARY KEY, pid INT NULL, v INT, FOREIGN KEY (pid) REFERENCES"
    " p (id) ON DELETE SET NULL ON UPDATE SET NULL)",
    "CREATE TABLE f (id INT PRIMARY KEY, pid INT, s INT, FOREIGN KEY (pid) REFERENCES p (id)"
    " ON DELETE CASCADE ON UPDATE CASCADE)",
    "CREATE TABLE k (a INT, b VARCHAR(10), v INT, PRIMARY KEY (a, b))",
    "CREATE TABLE u (id BIGINT UNSIGNED PRIMARY KEY, d DECIMAL(10,2), t DATETIME(3),"
    " e ENUM('x','y','z'), n VARCHAR(30))",
    "CREATE TABLE big (id INT PRIMARY KEY, v INT, w VARCHAR(40))",
    "CREATE TABLE nk (x INT, y VARCHAR(10))",
    "CREATE TABLE ci (code VARCHAR(20) PRIMARY KEY, v INT, note TEXT COMPRESSED)",
    "CREATE TABLE j (id INT PRIMARY KEY, doc JSON, b BLOB, pt POINT NULL)",
    "CREATE TABLE r (id INT PRIMARY KEY, v INT)",
    "CREATE TABLE dk (id DECIMAL(12,3) PRIMARY KEY, v INT, w DOUBLE)",
    "CREATE TABLE dt (t DATETIME(6) PRIMARY KEY, v INT)",
    "CREATE TABLE bn (id BINARY(16) PRIMARY KEY, v INT)",
    "CREATE TABLE m (id INT PRIMARY KEY, a INT, e ENUM('x','y','z'), s VARCHAR(30), v INT)",
    "CREATE TABLE tg (id INT AUTO_INCREMENT PRIMARY KEY, x INT, what VARCHAR(10))",
    "CREATE TRIGGER nk_in AFTER INSERT ON nk FOR EACH ROW INSERT INTO tg (x, what) VALUES"
    " (NEW.x, 'insert')",
    "CREATE TRIGGER nk_out AFTER DELETE ON nk FOR EACH ROW UPDATE tg SET what = 'deleted'"
    " WHERE x = OLD.x",
    "CREATE PROCEDURE bump(n INT) BEGIN UPDATE r SET v = v + 1 WHERE id < n;"
    " INSERT INTO tg (x, what) VALUES (n, 'call'); END",
)

FILL = (
    "INSERT INTO p SELECT seq, seq, CONCAT('p', seq) FROM seq_1_to_200",
    "INSERT INTO c SELECT seq, 1 + seq % 200, seq FROM seq_1_to_600",
    "INSERT INTO g SELECT seq, 1 + seq % 600 FROM seq_1_to_900",
    "INSERT INTO c2 SELECT seq, 1 + seq % 200, seq FROM seq_1_to_300",
    "INSERT INTO f SELECT seq, 1 + seq % 200, seq % 5 FROM seq_1_to_400",
    "INSERT INTO k SELECT seq % 50, CONCAT('b', seq), seq FROM seq_1_to_400",
    "INSERT INTO u SELECT seq * 1000000000000, seq / 7, '2024-01-01' + INTERVAL seq SECOND,"
    " 1 + seq % 3, CONCAT('n', seq) FROM seq_1_to_300",
    "INSERT INTO big SELECT seq, seq, REPEAT('w', seq % 40) FROM seq_1_to_{big}",
    "INSERT INTO nk SELECT seq % 30, CONCAT('y', seq % 7) FROM seq_1_to_200",
    "INSERT INTO ci SELECT CONCAT('c', seq), seq, REPEAT('n', seq % 9 * 30) FROM seq_1_to_500",
    "INSERT INTO j SELECT seq, JSON_OBJECT('a', seq, 'b', CONCAT('x', seq)),"
    " REPEAT(CHAR(seq % 256), seq % 50), IF(seq % 3 = 0, POINT(seq, seq / 2), NULL)"
    " FROM seq_1_to_400",
    "INSERT INTO r SELECT seq, seq FROM seq_1_to_300",
    "INSERT INTO dk SELECT seq / 8, seq, seq / 3 FROM seq_1_to_900",
    "INSERT INTO dt SELECT '2024-01-01' + INTERVAL seq * 1000 MICROSECOND, seq FROM seq_1_to_600",
    "INSERT INTO bn SELECT UNHEX(MD5(seq)), seq FROM seq_1_to_500",
    "INSERT INTO m SELECT seq, seq % 100, 1 + seq % 3, CONCAT('s', seq), seq FROM seq_1_to_2000",
    "INSERT INTO tg (x, what) SELECT seq, 'first' FROM seq_1_to_10",
)


def create(server: LocalMariaDB, database: str, *, big_rows: int = 5000) -> None:
    """``database`` made anew (``utf8mb4_general_ci``) with the tables, ``big`` of ``big_rows``."""
    server.execute(
        f"DROP DATABASE IF EXISTS {database}",
        f"CREATE DATABASE {database} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci",
    )
    server.execute(*SCHEMA, *(s.format(big=big_rows) for s in FILL), database=database)


def table_entries(database: str) -> list[dict[str, Any]]:
    """The pipeline's ``tables``: every table, the filtered one with its ``where``."""
    return [
        {"name": f"{database}.{t}", **({"where": FILTERS[t]} if t in FILTERS else {})}
        for t in TABLES
    ]


Cursor = Any


@dataclass(frozen=True, slots=True)
class Op:
    """One kind of random write: ``sql`` with ``args(workload)``, or a function doing several
    statements; ``session``: a session variable set to a value for that statement alone (such an
    operation runs outside any transaction: the server refuses the setting inside one)."""

    weight: int
    sql: str | Callable[[Cursor, Workload], None]
    args: Callable[[Workload], tuple[Any, ...]] = lambda w: ()
    session: tuple[str, str] | None = None

    def apply(self, cursor: Cursor, workload: Workload) -> None:
        if callable(self.sql):
            self.sql(cursor, workload)
            return
        if self.session is None:
            cursor.execute(self.sql, self.args(workload) or None)
            return
        variable, value = self.session
        cursor.execute(f"SET SESSION {variable} = '{value}'")
        try:
            cursor.execute(self.sql, self.args(workload) or None)
        finally:
            cursor.execute(f"SET SESSION {variable} = DEFAULT")


def _drop_one(cursor: Cursor, w: Workload, table: str, prefix: str) -> None:
    """Drop one of ``table``'s columns named ``prefix...``, if it has one."""
    cursor.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE()"
        " AND table_name = %s AND column_name LIKE %s",
        (table, f"{prefix}%"),
    )
    names = sorted(row[0] for row in cursor.fetchall())
    if names:
        cursor.execute(f"ALTER TABLE {table} DROP COLUMN {w.rng.choice(names)}")


def _rename_a(cursor: Cursor, w: Workload) -> None:
    """Rename ``m``'s column ``a`` (whatever it is called now)."""
    cursor.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE()"
        " AND table_name = 'm' AND column_name LIKE 'a%'"
    )
    for (name,) in cursor.fetchall():
        cursor.execute(f"ALTER TABLE m RENAME COLUMN {name} TO a{w.fresh()}")


def _swap_r(cursor: Cursor, w: Workload) -> None:
    """Replace ``r`` by a new table holding half its rows, changed."""
    cursor.execute("DROP TABLE IF EXISTS r_new")
    cursor.execute("CREATE TABLE r_new (id INT PRIMARY KEY, v INT)")
    cursor.execute("INSERT INTO r_new SELECT id, v + 5 FROM r WHERE MOD(id, 2) = 0")
    cursor.execute("RENAME TABLE r TO r_old, r_new TO r")
    cursor.execute("DROP TABLE r_old")


def _savepoint(cursor: Cursor, w: Workload) -> None:
    """A change rolled back to a savepoint, then another kept, in the transaction under way (a
    DDL before it in `Workload.write`'s transaction committed that one: then in one of its own)."""
    cursor.execute("SELECT @@in_transaction")
    alone = not cursor.fetchone()[0]
    if alone:
        cursor.execute("BEGIN")
    cursor.execute("SAVEPOINT sp")
    cursor.execute("UPDATE r SET v = -1 WHERE id = %s", (w.any(300),))
    cursor.execute("ROLLBACK TO SAVEPOINT sp")
    cursor.execute("UPDATE r SET v = v + 3 WHERE id = %s", (w.any(300),))
    if alone:
        cursor.execute("COMMIT")


def _child_with_grandchild(cursor: Cursor, w: Workload) -> None:
    child = w.fresh()
    cursor.execute("INSERT INTO c VALUES (%s, %s, 0)", (child, w.any(200)))
    cursor.execute("INSERT INTO g VALUES (%s, %s)", (w.fresh(), child))


def _truncate_c2(cursor: Cursor, w: Workload) -> None:
    """TRUNCATE (it commits the transaction it is in), then new rows, committed."""
    cursor.execute("TRUNCATE TABLE c2")
    cursor.execute("INSERT INTO c2 SELECT id, id, 0 FROM p ORDER BY id LIMIT 50")
    cursor.execute("COMMIT")


def _toggle_key(cursor: Cursor, w: Workload) -> None:
    """``dk`` without a primary key if it has one, else with one again (refused while it holds
    duplicates)."""
    cursor.execute(
        "SELECT COUNT(*) FROM information_schema.table_constraints WHERE table_schema = DATABASE()"
        " AND table_name = 'dk' AND constraint_type = 'PRIMARY KEY'"
    )
    keyed = cursor.fetchone()[0]
    cursor.execute("ALTER TABLE dk " + ("DROP PRIMARY KEY" if keyed else "ADD PRIMARY KEY (id)"))


def _optimize(cursor: Cursor, w: Workload) -> None:
    cursor.execute("OPTIMIZE TABLE ci")
    cursor.fetchall()


STATEMENT = ("binlog_format", "STATEMENT")

#: The random mix, one row per kind of write. DDL and table rebuilds are rarer than row changes.
OPERATIONS: tuple[Op, ...] = (
    Op(3, "INSERT INTO p VALUES (%s, 1, 'n')", lambda w: (w.fresh(),)),
    Op(3, "DELETE FROM p WHERE id = %s", lambda w: (w.any(300),)),
    Op(2, "UPDATE p SET id = %s WHERE id = %s", lambda w: (w.fresh(), w.any(300))),
    Op(2, "UPDATE p SET v = v - 1, s = 'u' WHERE MOD(id, 11) = %s", lambda w: (w.any(11),)),
    Op(2, "DELETE FROM p WHERE id = %s", lambda w: (w.any(300),), STATEMENT),
    Op(3, _child_with_grandchild),
    Op(2, "UPDATE c SET v = v + 1 WHERE MOD(id, 13) = %s", lambda w: (w.any(13),)),
    Op(2, "DELETE FROM c WHERE id = %s", lambda w: (w.any(700),)),
    Op(2, "UPDATE c SET id = %s WHERE id = %s", lambda w: (w.fresh(), w.any(700))),
    Op(2, "UPDATE c2 SET pid = %s WHERE id = %s", lambda w: (w.any(200), w.any(300))),
    Op(1, _truncate_c2),
    Op(2, "UPDATE f SET s = %s WHERE id = %s", lambda w: (w.any(5), w.any(400))),
    Op(2, "INSERT INTO f VALUES (%s, %s, %s)", lambda w: (w.fresh(), w.any(200), w.any(5))),
    Op(2, "REPLACE INTO k VALUES (%s, %s, %s)", lambda w: (w.any(50), f"b{w.any(400)}", w.fresh())),
    Op(1, "UPDATE k SET a = a + 1000 WHERE a = %s AND b LIKE 'b1%%'", lambda w: (w.any(50),)),
    Op(2, "UPDATE k SET b = UPPER(b) WHERE a = %s", lambda w: (w.any(50),)),
    Op(1, "INSERT INTO k VALUES (%s, 'mx', 1)", lambda w: (w.fresh(),), ("binlog_format", "MIXED")),
    Op(
        2,
        "INSERT INTO u (id, d, t, e, n) VALUES (%s, 1.5, NOW(3), 'y', 'odku')"
        " ON DUPLICATE KEY UPDATE n = CONCAT(n, '+'), d = d + 1",
        lambda w: (w.any(300) * 1000000000000,),
    ),
    Op(2, "UPDATE u SET t = t + INTERVAL 1 DAY, e = 'z' WHERE MOD(id, 7) = 0 LIMIT 5"),
    Op(1, lambda c, w: c.execute(f"ALTER TABLE u ADD COLUMN x{w.fresh()} INT DEFAULT 7")),
    Op(1, lambda c, w: _drop_one(c, w, "u", "x")),
    Op(
        3,
        "UPDATE big SET w = REPEAT('q', %s) WHERE id BETWEEN %s AND %s",
        lambda w: (w.any(40), *w.span(5000, 200)),
    ),
    Op(2, "DELETE FROM big WHERE id BETWEEN %s AND %s", lambda w: w.span(5000, 20)),
    Op(
        2,
        "INSERT INTO big SELECT seq + %s, seq, 'ins' FROM seq_1_to_100",
        lambda w: (w.fresh() * 100,),
    ),
    Op(
        2,
        "UPDATE big SET v = MOD(v * 3, 1000003) WHERE MOD(id, 17) = %s",
        lambda w: (w.any(17),),
        STATEMENT,
    ),
    Op(
        2,
        "UPDATE big SET v = v + 1 WHERE id = %s",
        lambda w: (w.any(5000),),
        ("binlog_row_image", "MINIMAL"),
    ),
    Op(
        1, lambda c, w: c.execute(f"ALTER TABLE big MODIFY w VARCHAR({w.rng.choice([40, 60, 80])})")
    ),
    Op(2, "INSERT INTO nk VALUES (%s, 'n')", lambda w: (w.any(30),)),
    Op(2, "DELETE FROM nk WHERE x = %s LIMIT 1", lambda w: (w.any(30),)),
    Op(2, "UPDATE nk SET y = 'u' WHERE x = %s", lambda w: (w.any(30),)),
    Op(2, "UPDATE ci SET code = UPPER(code) WHERE code = %s", lambda w: (f"c{w.any(600)}",)),
    Op(
        2,
        "UPDATE ci SET code = LOWER(code), v = v + 1 WHERE code = %s",
        lambda w: (f"C{w.any(600)}",),
    ),
    Op(2, "UPDATE ci SET code = CONCAT(code, ' ') WHERE code = %s", lambda w: (f"c{w.any(600)}",)),
    Op(2, "DELETE FROM ci WHERE code = %s", lambda w: (f"c{w.any(600)}",)),
    Op(1, _optimize),
    Op(
        2,
        "UPDATE j SET doc = JSON_SET(doc, '$.a', %s, '$.z', 'zz') WHERE MOD(id, 7) = %s",
        lambda w: (w.any(1000), w.any(7)),
    ),
    Op(
        2,
        "UPDATE j SET b = REPEAT('b', %s), pt = POINT(%s, 1) WHERE id = %s",
        lambda w: (w.any(3000), w.any(9), w.any(400)),
    ),
    Op(
        1,
        "INSERT INTO j VALUES (%s, JSON_ARRAY(1, 2, %s), NULL, NULL)",
        lambda w: (w.fresh(), w.any(9)),
    ),
    Op(1, _swap_r),
    Op(1, "CALL bump(%s)", lambda w: (w.any(40),)),
    Op(2, "DELETE m, r FROM m JOIN r ON m.id = r.id WHERE m.id = %s", lambda w: (w.any(400),)),
    Op(
        2,
        "INSERT INTO r VALUES (%s, 1) ON DUPLICATE KEY UPDATE v = MOD(v * 3, 1000003)",
        lambda w: (w.any(400),),
    ),
    Op(1, _savepoint),
    Op(2, "UPDATE dk SET id = id + 0.001, w = -0.0 WHERE v = %s", lambda w: (w.any(900),)),
    Op(2, "INSERT INTO dk VALUES (%s, 1, %s)", lambda w: (w.any(10**6) / 1000, w.rng.random())),
    Op(1, _toggle_key),
    Op(
        1,
        "INSERT INTO dk SELECT %s + seq / 1000, seq, 0 FROM seq_1_to_20",
        lambda w: (w.fresh(),),
        STATEMENT,
    ),
    Op(2, "INSERT INTO dt VALUES (NOW(6) - INTERVAL %s MICROSECOND, 1)", lambda w: (w.any(10**9),)),
    Op(
        2,
        "UPDATE dt SET v = v + 1 WHERE v = %s",
        lambda w: (w.any(600),),
        ("binlog_row_image", "MINIMAL"),
    ),
    Op(
        2,
        "UPDATE j SET pt = POINT(%s, 2) WHERE id = %s",
        lambda w: (w.any(9), w.any(400)),
        ("binlog_row_image", "NOBLOB"),
    ),
    Op(2, "UPDATE dt SET t = t + INTERVAL 1 MICROSECOND WHERE v = %s", lambda w: (w.any(600),)),
    Op(2, "UPDATE bn SET id = UNHEX(MD5(%s)) WHERE v = %s", lambda w: (w.fresh(), w.any(500))),
    Op(
        1,
        "DELETE FROM bn WHERE id < UNHEX(%s) LIMIT 3",
        lambda w: (f"{w.any(255):02x}" + "00" * 15,),
    ),
    Op(1, _rename_a),
    Op(1, lambda c, w: c.execute(f"ALTER TABLE m ADD COLUMN q{w.fresh()} INT DEFAULT 3 AFTER id")),
    Op(1, lambda c, w: _drop_one(c, w, "m", "q")),
    Op(1, "ALTER TABLE m MODIFY e ENUM('x','y','z','w')"),
    Op(
        2,
        "UPDATE m SET e = %s, v = v + 1 WHERE MOD(id, 97) = %s",
        lambda w: (w.rng.choice("xyz"), w.any(97)),
    ),
    Op(2, "DELETE FROM m ORDER BY id DESC LIMIT %s", lambda w: (1 + w.any(30),)),
    Op(
        2,
        "UPDATE m JOIN ci ON m.id = ci.v SET m.v = m.v + 1, ci.note = 'st'"
        " WHERE MOD(m.id, 31) = %s",
        lambda w: (w.any(31),),
        STATEMENT,
    ),
    Op(
        2,
        "UPDATE m JOIN r ON m.id = r.id SET m.s = 'j', r.v = r.v + 1 WHERE MOD(r.id, 13) = %s",
        lambda w: (w.any(13),),
    ),
)


class Workload:
    """The random writes of one seed on one database; ``xa``: the XA transaction it left
    prepared, if any."""

    rng: random.Random

    def __init__(self, seed: int, database: str, first_key: int = 1_000_000) -> None:
        self.rng = random.Random(seed)
        self.database = database
        self.xa: str | None = None
        self._next = first_key
        self._weights = [op.weight for op in OPERATIONS]

    def fresh(self) -> int:
        """A number no earlier call gave (new keys)."""
        self._next += 1
        return self._next

    def any(self, top: int) -> int:
        """A number from 0 to ``top``."""
        return self.rng.randint(0, top)

    def span(self, top: int, width: int) -> tuple[int, int]:
        """A range of keys: a start up to ``top`` and an end up to ``width`` past it."""
        start = self.any(top)
        return start, start + self.any(width)

    def connect(self, server: LocalMariaDB) -> pymysql.connections.Connection[Any]:
        """A connection to the workload's database whose lock waits give up after a second (a
        row of a prepared XA transaction stays locked until it ends)."""
        conn = server.connect(database=self.database)
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        return conn

    def write(self, conn: pymysql.connections.Connection[Any], count: int) -> None:
        """``count`` random writes on ``conn`` (autocommit): each in a transaction of its own, a
        fifth of them two to a transaction and some of those rolled back; one with a session
        setting runs alone. Raises what `EXPECTED_ERRORS` does not list."""
        with conn.cursor() as cursor:
            for _ in range(count):
                ops = self.rng.choices(
                    OPERATIONS, self._weights, k=2 if self.rng.random() < 0.2 else 1
                )
                try:
                    if any(op.session for op in ops):
                        for op in ops:
                            op.apply(cursor, self)
                        continue
                    cursor.execute("BEGIN")
                    for op in ops:
                        op.apply(cursor, self)
                    cursor.execute("ROLLBACK" if self.rng.random() < 0.15 else "COMMIT")
                except pymysql.MySQLError as exc:
                    if exc.args[0] not in EXPECTED_ERRORS:
                        raise
                    conn.rollback()

    def turn_xa(self, server: LocalMariaDB) -> None:
        """Commit or roll back the XA transaction left prepared, then, every other time, prepare
        another (rows of ``big``, sometimes of ``p``; a quarter of them logged as statements, a
        quarter with a row of ``xo`` alone) to stay open across the next run."""
        conn = self.connect(server)
        try:
            with conn.cursor() as cursor:
                if self.xa is not None:
                    self._end(cursor, self.rng.choice(["COMMIT", "ROLLBACK"]))
                if self.rng.random() < 0.5:
                    return
                name = f"{self.database}-{self.fresh()}"
                kind = self.rng.random()
                if kind < 0.25:  # its changes without row images: at its commit
                    cursor.execute("SET SESSION binlog_format = 'STATEMENT'")
                cursor.execute(f"XA START '{name}'")
                try:
                    if kind >= 0.75:  # nothing the pipeline reads: its tables know the commit
                        cursor.execute("INSERT INTO xo VALUES (%s, 0)", (self.fresh(),))
                    else:
                        cursor.execute(
                            "UPDATE big SET v = v + 100 WHERE id = %s", (self.any(5000),)
                        )
                    if kind < 0.75 and self.rng.random() < 0.5:
                        cursor.execute("UPDATE p SET v = 0 WHERE id = %s", (self.any(300),))
                    cursor.execute(f"XA END '{name}'")
                    cursor.execute(f"XA PREPARE '{name}'")
                except pymysql.MySQLError as exc:  # a lock wait: nothing prepared
                    if exc.args[0] not in EXPECTED_ERRORS:
                        raise
                    cursor.execute(f"XA END '{name}'")
                    cursor.execute(f"XA ROLLBACK '{name}'")
                    return
                self.xa = name
        finally:
            conn.close()

    def end_xa(self, server: LocalMariaDB) -> None:
        """Roll back the XA transaction left prepared (the server is shared by other tests)."""
        if self.xa is not None:
            conn = self.connect(server)
            try:
                with conn.cursor() as cursor:
                    self._end(cursor, "ROLLBACK")
            finally:
                conn.close()

    def _end(self, cursor: Cursor, how: str) -> None:
        """``XA COMMIT`` or ``XA ROLLBACK`` of the prepared one; one the server already rolled
        back is gone (XA_RBROLLBACK)."""
        try:
            cursor.execute(f"XA {how} '{self.xa}'")
        except pymysql.MySQLError as exc:
            if exc.args[0] != XA_RBROLLBACK:
                raise
        self.xa = None


class Writer(threading.Thread):
    """Random writes of its own seed on a connection of its own until `stop`, one each ``pause``
    seconds: the source changing while a run reads it."""

    def __init__(
        self, server: LocalMariaDB, database: str, seed: int, pause: float = 0.002
    ) -> None:
        super().__init__(name=f"writer {seed}", daemon=True)
        # new keys of its own, small enough for an INT a hundred times over
        self.workload = Workload(seed, database, first_key=2_000_000 + 20_000 * (seed % 100))
        self.server, self.pause = server, pause
        self.error: BaseException | None = None
        self._stop_writing = threading.Event()

    def run(self) -> None:
        conn = self.workload.connect(self.server)
        try:
            while not self._stop_writing.is_set():
                self.workload.write(conn, 1)
                time.sleep(self.pause)
        except BaseException as exc:  # raised again by `stop`
            self.error = exc
        finally:
            conn.close()

    def stop(self) -> None:
        """Stop writing; raise what stopped the writer if something did."""
        self._stop_writing.set()
        self.join()
        if self.error is not None:
            raise self.error
