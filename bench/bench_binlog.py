"""Binlog throughput: Tidemark's capture vs `mariadb-binlog -vv` vs the plain library loop.

All read the same binlog file of a private MariaDB on this machine: about
``--changes`` row changes of ``shop.orders`` (10 columns: BIGINT UNSIGNED, INT,
ENUM, DECIMAL, FLOAT, DATETIME(6), TIMESTAMP(6), TINYINT(1), SET, VARCHAR) -
inserts, then an update of every row, then deletes of half of them, each in one
transaction - alone in a fresh binlog file.

(a) ``mariadb-binlog --base64-output=DECODE-ROWS -vv FILE > /dev/null`` (the server's
    own decoder, reading the file from the datadir);
(b) python-mysql-replication's plain loop: ``BinLogStreamReader``, iterate ``event.rows``;
(c) Tidemark's ``capture_changes`` end to end (stream, decode, Arrow, Parquet segments,
    checkpoints), with its own decoder;
(d) the same with the library decoder (the capture before the fast decoder).

Rows per second are row changes per second of wall time (best of ``--repeat``); CPU
seconds are printed too, since the machine is shared. Then the ratios (c)/(a) and (c)/(b).

    .venv/bin/python bench/bench_binlog.py --changes 500000
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pymysqlreplication import BinLogStreamReader  # noqa: E402
from pymysqlreplication.row_event import (  # noqa: E402
    DeleteRowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from bench.shop_lake import scratch_server  # noqa: E402
from orchestrator.app.demo.localdb import LocalMariaDB  # noqa: E402
from orchestrator.app.demo.sample import connect, load_shop  # noqa: E402
from orchestrator.config import parse_config  # noqa: E402
from orchestrator.pipeline.capture.step import CaptureTable, capture_changes  # noqa: E402
from orchestrator.positions import BinlogPosition  # noqa: E402
from orchestrator.source.connection import Source  # noqa: E402
from orchestrator.state.store import StateStore  # noqa: E402

INSERT = """INSERT INTO shop.orders SELECT 1000000 + seq, seq % 977 + 1,
    ELT(seq % 4 + 1, 'new','paid','shipped','cancelled'), (seq % 100000) / 100,
    IF(seq % 7 = 0, NULL, (seq % 1000) / 8),
    TIMESTAMP('2024-01-01') + INTERVAL seq SECOND + INTERVAL (seq % 1000000) MICROSECOND,
    TIMESTAMP('2025-01-01') + INTERVAL seq SECOND, seq % 2,
    IF(seq % 5 = 0, NULL, ELT(seq % 3 + 1, 'gift', 'fragile,express', '')),
    IF(seq % 3 = 0, NULL, CONCAT('note ', seq, IF(seq % 11 = 0, ' é', '')))
    FROM seq_1_to_{n}"""


def make_binlog(server: LocalMariaDB, changes: int) -> tuple[BinlogPosition, BinlogPosition]:
    """``changes`` row changes of shop.orders alone in a fresh binlog file: (start, stop)."""
    inserts = changes * 2 // 5
    conn = connect("127.0.0.1", server.port, "root", "")
    try:
        load_shop(conn, 10)
        with conn.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW MASTER STATUS")
            start = cur.fetchone()
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(INSERT.format(n=inserts))
            cur.execute(
                "UPDATE shop.orders SET amount = amount + 1,"
                " note = IF(id % 4 = 0, NULL, 'upd') WHERE id > 1000000"
            )
            cur.execute("DELETE FROM shop.orders WHERE id > 1000000 AND id % 2 = 0")
            cur.execute("SHOW MASTER STATUS")
            stop = cur.fetchone()
    finally:
        conn.close()
    return BinlogPosition(str(start[0]), int(start[1])), BinlogPosition(str(stop[0]), int(stop[1]))


def timed(run: Callable[[], int], repeat: int, children: bool = False) -> tuple[float, float, int]:
    """Best wall seconds over ``repeat`` runs, the CPU seconds of that run, and its rows."""
    best: tuple[float, float, int] | None = None
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    for _ in range(repeat):
        usage = resource.getrusage(who)
        start = time.perf_counter()
        rows = run()
        wall = time.perf_counter() - start
        after = resource.getrusage(who)
        cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
        if best is None or wall < best[0]:
            best = (wall, cpu, rows)
    assert best is not None
    return best


def mariadb_binlog(path: Path, rows: int) -> Callable[[], int]:
    tool = shutil.which("mariadb-binlog") or "/usr/bin/mariadb-binlog"

    def run() -> int:
        with open(os.devnull, "wb") as sink:
            subprocess.run(
                [tool, "--no-defaults", "--base64-output=DECODE-ROWS", "-vv", str(path)],
                stdout=sink,
                check=True,
            )
        return rows

    return run


def library_loop(server: LocalMariaDB, start: BinlogPosition) -> Callable[[], int]:
    def run() -> int:
        stream = BinLogStreamReader(
            connection_settings={
                "host": "127.0.0.1",
                "port": server.port,
                "user": "root",
                "passwd": "",
            },
            server_id=54099,
            log_file=start.file,
            log_pos=start.pos,
            resume_stream=True,
            blocking=False,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
            only_schemas=["shop"],
            only_tables=["orders"],
            enable_logging=False,
        )
        rows = 0
        try:
            for event in stream:
                for _row in event.rows:
                    rows += 1
        finally:
            stream.close()
        return rows

    return run


def capture(
    server: LocalMariaDB, work: Path, start: BinlogPosition, stop: BinlogPosition, decoder: Any
) -> Callable[[], int]:
    def run() -> int:
        scratch = Path(tempfile.mkdtemp(prefix="capture-", dir=work))
        config = parse_config(
            {
                "pipeline": "bench",
                "source": server.source_config(),
                "spark": {"master": "local[1]"},
                "output": {"path": str(scratch / "lake")},
                "state": {"url": f"sqlite:///{scratch / 'state.db'}"},
                "tables": [{"name": "shop.orders"}],
            }
        )
        with Source.from_pipeline(config) as source:
            info = source.table_info("shop.orders")
        store = StateStore(config.state.url)
        run_id = store.create_run("bench", {}).run_id
        result = capture_changes(
            config,
            store,
            run_id,
            {"shop.orders": CaptureTable(info, ("id",), start)},
            stop,
            decoder=decoder,
        )
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)
        return sum(result.rows.values())

    return run


def line(label: str, wall: float, cpu: float, rows: int) -> float:
    rate = rows / wall
    print(f"{label:<50} {wall:7.2f}s  cpu {cpu:6.2f}s  {rows:>8,} rows  {rate:12,.0f} rows/s")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=500_000, help="row changes in the binlog")
    parser.add_argument("--repeat", type=int, default=3, help="runs of (a) and (c); best is kept")
    parser.add_argument(
        "--no-library-capture",
        action="store_true",
        help="skip (d), the capture with the library decoder (slow)",
    )
    args = parser.parse_args()

    with scratch_server("tidemark-bench-binlog-") as (work, server):
        started = time.perf_counter()
        start, stop = make_binlog(server, args.changes)
        path = server.datadir / start.file
        inserts = args.changes * 2 // 5
        changes = 2 * inserts + inserts // 2  # insert, update each, delete the even ids
        print(
            f"binlog {start.file}: {path.stat().st_size / 1e6:.1f} MB, ~{changes:,} row changes"
            f" of shop.orders, made in {time.perf_counter() - started:.1f}s"
        )

        a = line(
            "(a) mariadb-binlog --base64-output=DECODE-ROWS -vv",
            *timed(mariadb_binlog(path, changes), args.repeat, children=True),
        )
        c_wall, c_cpu, c_rows = timed(capture(server, work, start, stop, "fast"), args.repeat)
        c = line("(c) tidemark capture_changes (fast decoder)", c_wall, c_cpu, c_rows)
        b = line("(b) python-mysql-replication loop", *timed(library_loop(server, start), 1))
        d = None
        if not args.no_library_capture:
            d = line(
                "(d) tidemark capture_changes (library decoder)",
                *timed(capture(server, work, start, stop, "library"), 1),
            )
        assert c_rows == changes, f"capture kept {c_rows} changes, expected {changes}"
        print(f"ratio (c)/(a) capture / mariadb-binlog    {c / a:6.2f}x")
        print(f"ratio (c)/(b) capture / library loop      {c / b:6.2f}x")
        if d is not None:
            print(f"ratio (c)/(d) capture fast / library      {c / d:6.2f}x")
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"machine: {os.cpu_count()} cores, load average {load}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
