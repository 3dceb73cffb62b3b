"""Incremental run vs initial snapshot: `tidemark run` end to end, side by side on one table.

Loads the sample shop (`orchestrator.app.demo.sample.load_shop`) into a private MariaDB,
snapshots ``shop.orders`` (``--rows`` N, default 1,000,000: a few minutes on 2 cores)
with `tidemark run`, applies 10,000 row changes, and runs again: the second run
captures the binlog and rewrites only the files holding changed keys. Each run is
its own process, as a user or an Airflow task runs it (a run that needs Spark pays
the JVM start; it is measured alone too). Prints both times and their ratio, and
how many rows and files the incremental run rewrote out of the table's.

Change patterns (``--pattern``), 10,000 row changes each:

- ``recent``: what an OLTP table mostly sees: 40% inserts above the largest key,
  10% inserts between existing keys, 35% updates, 10% deletes and 5% key changes
  among the newest 1% of the keys (at least twice as many keys as it changes);
- ``uniform``: the same mix over the whole key range: the worst case for
  copy-on-write, every file holds some changed key.

    .venv/bin/python bench/bench_incremental.py
    .venv/bin/python bench/bench_incremental.py --rows 5000000 --pattern uniform
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import load_sample_shop, scratch_server, write_pipeline  # noqa: E402

TABLE_DIR = ("shop", "orders")
_JVM_ONLY = """
import sys, time
sys.path.insert(0, {root!r})
from orchestrator.config import load_config
from orchestrator.pipeline.context import spark_session
start = time.perf_counter()
spark_session(load_config({config!r})).range(1).count()
print(time.perf_counter() - start)
"""


_CLI = """
import sys
sys.path.insert(0, {root!r})
from orchestrator.lake import layout
from orchestrator.pipeline.reconcile import rewrite as reconcile
layout.TARGET_FILE_BYTES = {target}
if {spark}:
    reconcile.LOCAL_CHANGES_BYTES = 0  # every rewrite on Spark
from orchestrator.app.cli import main
sys.exit(main(["run", "--config", {config!r}, "--no-progress"]))
"""


def tidemark_run(
    config: Path, log: Path | None, target: int, spark: bool = False
) -> tuple[float, str]:
    """Seconds of one `tidemark run` in its own process, with ``target`` as the layout's target
    file size (``spark``: rewrites on Spark), and the engine that rewrote the files (its log,
    the run's log file, is saved to ``log``)."""
    start = time.perf_counter()
    code = _CLI.format(root=str(ROOT), config=str(config), target=target, spark=spark)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    logs = sorted((config.parent / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    text = logs[-1].read_text() if logs else done.stderr
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
    if done.returncode != 0:
        raise SystemExit(f"tidemark run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, rewrite_engine(text)


def rewrite_engine(log: str) -> str:
    """Which engine the reconcile used, from a run's log."""
    if "the driver (pyarrow) rewrote" in log:
        return "pyarrow in the driver"
    if "Spark rewrote" in log:
        return "Spark"
    return "Spark, whole table" if "Spark reconciled the whole table" in log else "unknown"


def warm_run(config: Path, target: int) -> float:
    """Seconds of one `run_command` in this process, whose SparkSession is already running."""
    from orchestrator.app.run import run_command
    from orchestrator.config import load_config
    from orchestrator.lake import layout

    layout.TARGET_FILE_BYTES = target
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        run_command(load_config(config), tables=[], snapshot=False, chunk_size=None, progress=False)
    return time.perf_counter() - start


def jvm_start(config: Path) -> float:
    """Seconds to start a SparkSession with the pipeline's settings and run one tiny job."""
    code = _JVM_ONLY.format(root=str(ROOT), config=str(config))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def apply_changes(
    conn: Any,
    rows: int,
    pattern: str,
    total: int,
    seed: int = 1,
    *,
    top: int | None = None,
    between: int = 3,
) -> dict[str, int]:
    """``total`` row changes to shop.orders (ids are 10, 20, ... 10 * rows); returns rows per kind.

    Inserts above go from ``top`` (default ``10 * rows``) up, inserts between are at ``10 * k +
    between``: a second call on the same table passes others so that no insert collides."""
    rng = random.Random(seed)
    top = 10 * rows if top is None else top
    counts = {
        "insert above": total * 40 // 100,
        "insert between": total * 10 // 100,
        "update": total * 35 // 100,
        "delete": total * 10 // 100,
    }
    counts["key change"] = total - sum(counts.values())
    keys = counts["update"] + counts["delete"] + counts["key change"]
    low = 1 if pattern == "uniform" else max(1, rows - max(rows // 100, 2 * keys))
    existing = [10 * k for k in rng.sample(range(low, rows + 1), keys)]
    updates = existing[: counts["update"]]
    deletes = existing[counts["update"] : counts["update"] + counts["delete"]]
    moves = existing[counts["update"] + counts["delete"] :]
    between_ids = [
        10 * k + between for k in rng.sample(range(low, rows + 1), counts["insert between"])
    ]
    done = dict.fromkeys(counts, 0)
    with conn.cursor() as cur:
        for kind, ids, sql in (
            (
                "update",
                updates,
                "UPDATE orders SET amount = amount + 1, note = 'bench' WHERE id IN ({})",
            ),
            ("delete", deletes, "DELETE FROM orders WHERE id IN ({})"),
            ("key change", moves, "UPDATE orders SET id = id + 5 WHERE id IN ({})"),
        ):
            for i in range(0, len(ids), 1000):
                batch = ids[i : i + 1000]
                done[kind] += cur.execute(sql.format(", ".join(["%s"] * len(batch))), batch)
        for i in range(0, len(between_ids), 1000):
            batch = between_ids[i : i + 1000]
            done["insert between"] += cur.execute(
                "INSERT INTO orders (id, customer_id, status, amount, created_at) VALUES "
                + ", ".join(["(%s, 1, 'new', 1.5, NOW(6))"] * len(batch)),
                batch,
            )
        done["insert above"] += cur.execute(
            "INSERT INTO orders (id, customer_id, status, amount, created_at, note)"
            f" SELECT {top} + seq * 10, seq % 1000 + 1, 'new', seq / 100, NOW(6), 'new order'"
            f" FROM seq_1_to_{counts['insert above']}"
        )
    return done


def manifests(lake: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    versions = lake.joinpath(*TABLE_DIR, "_tidemark", "versions")
    first, second = (json.loads((versions / f"{v:06d}.json").read_text()) for v in (1, 2))
    return first, second


def report(
    first: dict[str, Any], second: dict[str, Any], snapshot: float, incremental: float, engine: str
) -> None:
    """Print both runs side by side: seconds and ratio, rows and files rewritten out of the
    table's."""
    new = [r for r in second["file_ranges"] if r["file"] not in first["files"]]
    replaced = [f for f in first["files"] if f not in second["files"]]
    rewritten = sum(r["rows"] for r in new)
    size = sum(r["bytes"] for r in first["file_ranges"]) / 2**20
    print(
        f"initial snapshot  {first['rows']:>12,} rows  {snapshot:8.2f}s  "
        f"{len(first['files'])} files,"
        f" {size:,.1f} MiB"
    )
    print(
        f"incremental run   {second['rows']:>12,} rows  {incremental:8.2f}s  "
        f"rewrote {len(replaced)} of {len(first['files'])} files into {len(new)} new, "
        f"shared {len(second['files']) - len(new)};"
        f" engine: {engine}"
    )
    print(
        f"rows rewritten    {rewritten:>12,} of {second['rows']:,} "
        f"({rewritten / max(second['rows'], 1):.1%}),"
        f" {sum(r['bytes'] for r in new) / 2**20:,.1f} MiB"
    )
    print(f"ratio incremental/snapshot  {incremental / snapshot:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="rows of shop.orders (default 1,000,000)"
    )
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--pattern", choices=("recent", "uniform"), default="recent")
    parser.add_argument("--chunk-size", type=int, default=100_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--verify", action="store_true", help="compare the published table with the source"
    )
    parser.add_argument(
        "--logs", type=Path, help="save each run's log (snapshot.log, incremental.log) here"
    )
    parser.add_argument(
        "--target-mb",
        type=float,
        default=None,
        help="target data file size (default: orchestrator.lake.layout.TARGET_FILE_BYTES)",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "spark"),
        default="auto",
        help="spark: the incremental rewrite on Spark (to compare with the driver's)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="both runs in this process on one SparkSession started beforehand (as with a "
        "long-lived driver or Spark Connect): no JVM start in either figure",
    )
    args = parser.parse_args()

    with scratch_server("tidemark-bench-incr-") as (work, server):
        conn = load_sample_shop(server, args.rows)
        config_path = write_pipeline(
            work,
            server,
            name="bench_incr",
            master=args.master,
            defaults={"chunk_size": args.chunk_size},
        )

        from orchestrator.lake import layout

        target = int(args.target_mb * 2**20) if args.target_mb else layout.TARGET_FILE_BYTES
        # which engine rewrote the files (the log says, when each run is a process)
        engine = "in-process"
        if args.warm:
            from orchestrator.config import load_config
            from orchestrator.pipeline.context import spark_session

            t0 = time.perf_counter()
            spark_session(load_config(config_path)).range(1).count()
            jvm = time.perf_counter() - t0
            snapshot = warm_run(config_path, target)
        else:
            snapshot, _ = tidemark_run(
                config_path, args.logs / "snapshot.log" if args.logs else None, target
            )
        conn.select_db("shop")
        done = apply_changes(conn, args.rows, args.pattern, args.changes)
        if args.warm:
            incremental = warm_run(config_path, target)
        else:
            incremental, engine = tidemark_run(
                config_path,
                args.logs / "incremental.log" if args.logs else None,
                target,
                args.engine == "spark",
            )
            jvm = jvm_start(config_path)
        print(
            f"changes applied: {sum(done.values()):,} rows "
            f"({', '.join(f'{k} {v:,}' for k, v in done.items())}),"
            f" pattern {args.pattern}"
        )
        report(*manifests(work / "lake"), snapshot, incremental, engine)
        mode = "warm SparkSession, in-process" if args.warm else "each run its own process"
        print(
            f"({mode}; JVM start alone {jvm:.1f}s; target file {target / 2**20:g} MiB;"
            f" machine: {os.cpu_count()} cores, master {args.master}, chunk {args.chunk_size:,})"
        )
        if args.verify:
            from orchestrator.app.demo.verify import verify_table
            from orchestrator.config import load_config
            from orchestrator.source.connection import Source

            pipeline = load_config(config_path)
            with Source.from_pipeline(pipeline) as source:
                info = source.table_info("shop.orders")
            result = verify_table(
                conn, info, info.primary_key, str(work.joinpath("lake", *TABLE_DIR))
            )
            print(result.summary())
            if not result.equal:
                return 1
        conn.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
