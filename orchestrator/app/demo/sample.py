"""Sample tables and a concurrent writer: for the demo, the consistency tests and benchmarks.

`load_shop` builds a small shop schema with a numeric key, a string key and a
composite key, and columns of many types. `Writer` keeps inserting, updating,
deleting and changing primary keys from a background thread until stopped,
as a live application would while a snapshot runs.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Any

import pymysql

log = logging.getLogger(__name__)

SHOP_TABLES = ("orders", "customers", "order_items")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {db}.orders (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        customer_id INT NOT NULL,
        status ENUM('new','paid','shipped','cancelled') NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        weight FLOAT NULL,
        created_at DATETIME(6) NOT NULL,
        updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        paid TINYINT(1) NOT NULL DEFAULT 0,
        tags SET('gift','fragile','express') NULL,
        note VARCHAR(200) NULL
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS {db}.customers (
        email VARCHAR(120) NOT NULL PRIMARY KEY,
        name VARCHAR(100) NOT NULL,
        country CHAR(2) NULL,
        birth DATE NULL,
        balance DOUBLE NULL,
        profile JSON NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci""",
    """CREATE TABLE IF NOT EXISTS {db}.order_items (
        order_id BIGINT UNSIGNED NOT NULL,
        line_no SMALLINT NOT NULL,
        sku VARBINARY(16) NOT NULL,
        qty MEDIUMINT UNSIGNED NOT NULL,
        price DECIMAL(40,10) NULL,
        PRIMARY KEY (order_id, line_no)
    ) ENGINE=InnoDB""",
)


def connect(
    host: str, port: int, user: str, password: str, database: str | None = None
) -> pymysql.connections.Connection[Any]:
    return pymysql.connect(
        host=host,
        port=port,
        user=user,
        password=password,
        database=database,
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=10,
    )


def load_shop(conn: pymysql.connections.Connection[Any], rows: int, db: str = "shop") -> None:
    """Create the shop tables in ``db`` with ``rows`` orders, rows/4 customers, ~2 items per order.

    Uses MariaDB's Sequence engine (``seq_1_to_N``) so loading a million rows takes seconds.
    """
    customers = max(rows // 4, 1)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {db}")
        cur.execute(f"USE {db}")
        for statement in _SCHEMA:
            cur.execute(statement.format(db=db))
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(
            f"""INSERT INTO {db}.orders SELECT seq * 10, seq % {customers} + 1,
                ELT(seq % 4 + 1, 'new','paid','shipped','cancelled'),
                (seq % 100000) / 100, IF(seq % 7 = 0, NULL, (seq % 1000) / 8),
                TIMESTAMP('2024-01-01') + INTERVAL seq SECOND + \
INTERVAL (seq % 1000000) MICROSECOND,
                TIMESTAMP('2025-01-01') + INTERVAL seq SECOND, seq % 2,
                IF(seq % 5 = 0, NULL, ELT(seq % 3 + 1, 'gift', 'fragile,express', '')),
                IF(seq % 3 = 0, NULL, CONCAT('note ', seq, IF(seq % 11 = 0, ' \\'quoted\\' é', '')))
                FROM seq_1_to_{rows}"""
        )
        cur.execute(
            f"""INSERT INTO {db}.customers SELECT CONCAT('user', seq, '@example.com'),
                CONCAT('Customer ', seq), IF(seq % 9 = 0, NULL, ELT(seq % 3 + 1, 'DE', 'FR', 'US')),
                IF(seq % 13 = 0, NULL, DATE('1950-01-01') + INTERVAL (seq % 20000) DAY),
                IF(seq % 4 = 0, NULL, seq / 3),
                IF(seq % 6 = 0, NULL, JSON_OBJECT('tier', seq % 3, 'vip', seq % 2 = 0))
                FROM seq_1_to_{customers}"""
        )
        cur.execute(
            f"INSERT INTO {db}.order_items SELECT o.seq * 10, l.seq, "
            f"""UNHEX(LPAD(HEX(o.seq * 7 + l.seq), 8, '0')),
                o.seq % 5 + 1, IF(l.seq = 2, NULL, (o.seq % 1000) / 7)
                FROM seq_1_to_{rows} o JOIN seq_1_to_2 l"""
        )
        cur.execute("ANALYZE TABLE " + ", ".join(f"{db}.{t}" for t in SHOP_TABLES))
        cur.fetchall()


@dataclass
class Writer:
    """Writes to the shop tables from a background thread until `stop`.

    Every kind of change a snapshot must survive: inserts above and inside the
    key range, updates, deletes, primary-key changes, and NULLs.
    """

    host: str
    port: int
    user: str
    password: str
    db: str = "shop"
    seed: int = 7
    pause: float = 0.002
    changes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    error: BaseException | None = None

    def start(self) -> Writer:
        self._thread = threading.Thread(
            target=self._loop, name="tidemark-sample-writer", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop, wait, re-raise a writer error; returns the number of statements done."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.error is not None:
            raise self.error
        return self.changes

    def _loop(self) -> None:
        rng = random.Random(self.seed)
        try:
            conn = connect(self.host, self.port, self.user, self.password, self.db)
            with conn.cursor() as cur:
                cur.execute("SELECT COALESCE(MAX(id), 0) FROM orders")
                next_id = int(cur.fetchone()[0]) + 1
                while not self._stop.is_set():
                    next_id = self._one(cur, rng, next_id)
                    self.changes += 1
                    if self.pause:
                        self._stop.wait(self.pause)
            conn.close()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _one(self, cur: Any, rng: random.Random, next_id: int) -> int:
        top = max(next_id - 1, 10)
        k = rng.randrange(1, top)
        action = rng.random()
        if action < 0.25:
            cur.execute(
                "INSERT IGNORE INTO orders (id, customer_id, status, amount, weight, created_at,"
                " paid, tags, note) VALUES (%s, %s, 'new', %s, NULL, NOW(6), 0, 'gift', %s)",
                (next_id, rng.randrange(1, 1000), rng.randrange(1, 10**6) / 100, f"w{next_id}"),
            )
            cur.execute(
                "INSERT IGNORE INTO order_items VALUES (%s, 1, %s, 1, 9.5)",
                (next_id, next_id.to_bytes(8, "big")),
            )
            return next_id + 1
        if action < 0.32:  # insert inside the key range (ids not multiple of 10 are free)
            cur.execute(
                "INSERT IGNORE INTO orders (id, customer_id, status, amount, created_at)"
                " VALUES (%s, 1, 'paid', 1.5, NOW(6))",
                (k * 10 + 3,),
            )
        elif action < 0.60:
            cur.execute(
                "UPDATE orders SET status = ELT(1 + FLOOR(RAND() * 4), 'new','paid','shipped',"
                "'cancelled'), amount = amount + 1, note = IF(RAND() < 0.2, NULL, 'upd'),"
                " updated_at = NOW(6) WHERE id BETWEEN %s AND %s",
                (k, k + 40),
            )
        elif action < 0.70:
            cur.execute("DELETE FROM orders WHERE id BETWEEN %s AND %s", (k, k + 15))
        elif action < 0.76:  # primary-key change
            cur.execute("UPDATE IGNORE orders SET id = id + 5 WHERE id = %s", (k - k % 10,))
        elif action < 0.86:
            email = f"user{rng.randrange(1, 2000)}@example.com"
            cur.execute(
                "UPDATE customers SET balance = IFNULL(balance, 0) + 1, country = NULL"
                " WHERE email = %s",
                (email,),
            )
            cur.execute(
                "INSERT IGNORE INTO customers (email, name, country) VALUES (%s, %s, 'NL')",
                (f"new{rng.randrange(10**9)}@Example.com", "Nieuw"),
            )
        elif action < 0.93:  # string primary-key change
            cur.execute(
                "UPDATE IGNORE customers SET email = CONCAT('moved.', email) WHERE email = %s",
                (f"user{rng.randrange(1, 2000)}@example.com",),
            )
        else:
            cur.execute(
                "UPDATE order_items SET qty = qty + 1, price = NULL WHERE order_id = %s",
                (k - k % 10,),
            )
            cur.execute(
                "DELETE FROM order_items WHERE order_id = %s AND line_no = 2",
                (rng.randrange(1, top),),
            )
        return next_id
