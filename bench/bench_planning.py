"""Planning cost on a sparse table: `plan_table` (uneven index walks) vs one `SELECT COUNT(*)` scan.

Builds a table of ``--rows`` rows (10M by default) with sparse BIGINT keys
(about one key value in a thousand used, so the even strategy is out) in a
private MariaDB, then, side by side on one warm connection: plans it and
counts it. Prints rows, chunks, seconds, queries issued and index entries read
for both; the ratio plan/scan is the figure docs/performance.md reports. Planning
should read each index entry about once, like the scan, not once per chunk.

    .venv/bin/python bench/bench_planning.py --rows 10000000 --chunk-size 50000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import scratch_server  # noqa: E402
from chunking.splitter import open_splitter  # noqa: E402
from orchestrator.app.demo.localdb import LocalMariaDB  # noqa: E402
from orchestrator.config import Defaults, SourceConfig, TableConfig  # noqa: E402
from orchestrator.pipeline.plan.chunks import plan_table  # noqa: E402
from orchestrator.source.connection import Source  # noqa: E402

TABLE = "bench.events"
LOAD_STEP = 1_000_000


def load(server: LocalMariaDB, rows: int, gap: int) -> float:
    """Sparse keys ``seq * gap + jitter`` (jitter < gap keeps them unique), loaded server-side."""
    start = time.perf_counter()
    server.execute(
        "CREATE DATABASE bench",
        f"CREATE TABLE {TABLE} (id BIGINT UNSIGNED NOT NULL PRIMARY KEY, account INT NOT NULL,"
        " amount DECIMAL(12, 2) NOT NULL, note VARCHAR(40) NOT NULL) ENGINE=InnoDB",
    )
    for first in range(1, rows + 1, LOAD_STEP):
        last = min(rows, first + LOAD_STEP - 1)
        server.execute(
            f"INSERT INTO {TABLE} SELECT seq * {gap} + (seq * 7919) % {gap}, seq % 5000,"
            f" (seq % 100000) / 100, CONCAT('note-', seq) FROM bench.seq_{first}_to_{last}"
        )
    server.execute(f"ANALYZE TABLE {TABLE}")
    return time.perf_counter() - start


def index_reads(source: Source) -> int:
    status = {str(k): int(v) for k, v in source.query("SHOW SESSION STATUS LIKE 'Handler_read%'")}
    return sum(
        status.get(k, 0)
        for k in (
            "Handler_read_first",
            "Handler_read_key",
            "Handler_read_next",
            "Handler_read_prev",
            "Handler_read_last",
        )
    )


def measure(source: Source, work: Any) -> tuple[float, int, Any]:
    """Seconds and handler reads of ``work()`` on the source's connection."""
    before = index_reads(source)
    start = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    return seconds, index_reads(source) - before, result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--chunk-size", type=int, default=50_000)
    parser.add_argument("--gap", type=int, default=1000, help="key values per row (sparseness)")
    parser.add_argument("--repeat", type=int, default=2, help="measurements of each (best is kept)")
    parser.add_argument(
        "--batch", type=int, default=16, help="chunks in the first batch (lazy splitter)"
    )
    args = parser.parse_args()

    # binlog off (planning does not need it; it only slows the load); a pool the table fits in
    with scratch_server("tidemark-bench-plan-", {"innodb-buffer-pool-size": "2G"}) as (_, server):
        loaded = load(server, args.rows, args.gap)
        print(
            f"loaded {args.rows:,} rows into {TABLE} (ids seq*{args.gap}+jitter) in {loaded:.1f}s"
        )
        config = SourceConfig(host="127.0.0.1", port=server.port, user="root", server_id=1)
        table_config = TableConfig(TABLE, chunk_size=args.chunk_size, batch_chunks=args.batch)
        with Source(config, "") as source:
            info = source.table_info(TABLE)
            source.query(f"SELECT COUNT(*) FROM {TABLE}")  # warm the buffer pool for both
            scans = [
                measure(source, lambda: source.query(f"SELECT COUNT(*) FROM {TABLE}"))
                for _ in range(args.repeat)
            ]
            plans = [
                measure(source, lambda: plan_table(source.query, table_config, info, Defaults()))
                for _ in range(args.repeat)
            ]
            first = time.perf_counter()
            splitter, _ = open_splitter(
                source.query,
                TABLE,
                ["id"],
                ["bigint"],
                args.chunk_size,
                row_estimate=info.row_estimate,
            )
            assert splitter is not None
            chunks = splitter.chunks()
            for _ in range(args.batch):
                next(chunks, None)
            first_batch = time.perf_counter() - first
        scan_s, scan_reads, counted = min(scans, key=lambda m: m[0])
        plan_s, plan_reads, plan = min(plans, key=lambda m: m[0])
        rows = int(counted[0][0])
        s = plan.stats
        print(
            f"table {TABLE}: {rows:,} rows, estimate {info.row_estimate:,}, "
            f"strategy {plan.strategy} "
            f"({s['reason']}), chunk size {args.chunk_size:,}"
        )
        print(
            f"plan (index walks)    {plan_s:7.2f}s  {len(plan.chunks):6,} chunks  "
            f"{s['queries']:6,} queries  "
            f"{plan_reads:12,} index reads ({plan_reads / rows:.2f} per row)"
        )
        print(
            f"SELECT COUNT(*) scan  {scan_s:7.2f}s  {'':6} {'':7} {1:6,} queries  "
            f"{scan_reads:12,} index reads ({scan_reads / rows:.2f} per row)"
        )
        print(
            f"ratio plan/scan       {plan_s / scan_s:7.2f}x  "
            f"(machine: {os.cpu_count()} cores, shared; "
            f"best of {args.repeat})"
        )
        print(
            f"lazy splitter: first {args.batch} chunks ready after {first_batch:.2f}s "
            f"({first_batch / plan_s:.0%} of the full plan)"
        )
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
