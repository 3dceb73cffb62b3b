"""Many small tables vs one table of the same rows, side by side (issue 16).

One private MariaDB holds ``--tables`` tables of ``--rows`` rows each (``many.t0000`` ...) and one
table ``big.rows`` holding all those rows, the same five columns. Each repetition times, as a user
runs them (``tidemark run`` in a fresh process, fresh state and lake):

- the first run of one table (``big.rows``);
- the first run of the small tables, configured by one pattern entry (``many.*``);
- a second run of the small tables with no change in between;
- a third run after one row of every small table changed (an update each: every table is
  captured, rewritten and published again, docs/performance.md);
- ``tidemark status`` of the small tables' pipeline.

It prints the medians and the ratio small tables / one table (the issue's goal: at most 2x).

    .venv/bin/python bench/bench_tables.py --tables 200 --repeat 3
    .venv/bin/python bench/bench_tables.py --tables 2000
    .venv/bin/python bench/bench_tables.py --tables 200 --compare-with /tmp/tidemark-main

``--compare-with DIR`` also times the small tables' two runs with another checkout (say ``git
archive main | tar -x -C DIR``) in the same repetitions; its config lists the tables one by one,
as a release without patterns needs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_snapshot import fresh_config, median, run_env, timed_run  # noqa: E402
from bench.shop_lake import scratch_server  # noqa: E402
from orchestrator.app.demo.localdb import LocalMariaDB  # noqa: E402

COLUMNS = (
    "id BIGINT PRIMARY KEY, customer INT NOT NULL, amount DECIMAL(10,2), status VARCHAR(16), "
    "created DATETIME"
)
FILL = (
    "SELECT seq, seq % 97, seq * 1.5, ELT(1 + seq % 3, 'new', 'paid', 'sent'), "
    "'2024-01-01 00:00:00' + INTERVAL seq MINUTE FROM seq_1_to_{rows}"
)


def load(server: LocalMariaDB, tables: int, rows: int) -> None:
    """The small tables and the one big table, filled in one connection."""
    started = time.perf_counter()
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE many")
            cur.execute("CREATE DATABASE big")
            cur.execute("USE many")  # the seq_1_to_N tables need a current database
            for i in range(tables):
                cur.execute(f"CREATE TABLE many.t{i:04d} ({COLUMNS})")
                cur.execute(f"INSERT INTO many.t{i:04d} " + FILL.format(rows=rows))
            cur.execute(f"CREATE TABLE big.rows ({COLUMNS})")
            cur.execute("INSERT INTO big.rows " + FILL.format(rows=tables * rows))
    finally:
        conn.close()
    print(
        f"loaded {tables} tables of {rows} rows and one of {tables * rows:,} rows in "
        f"{time.perf_counter() - started:.1f}s",
        flush=True,
    )


def change_each(server: LocalMariaDB, tables: int, rows: int, repetition: int) -> None:
    """One row of every small table updated, one statement a table, in one transaction."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for i in range(tables):
                cur.execute(
                    f"UPDATE many.t{i:04d} SET amount = amount + 1 WHERE id = %s",
                    (1 + repetition % rows,),
                )
        conn.commit()
    finally:
        conn.close()


def pipeline(server: LocalMariaDB, name: str, entry: str, master: str) -> dict[str, Any]:
    return {
        "pipeline": name,
        "source": server.source_config(),
        "spark": {"master": master, "conf": {"spark.ui.enabled": "false"}},
        "output": {"path": "unset"},
        "state": {"url": "unset"},
        "tables": [{"name": entry}],
    }


def timed_status(config: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "orchestrator", "status", "--config", str(config)],
        env=run_env(ROOT),
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows", type=int, default=100, help="rows per small table")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    with scratch_server("tidemark-bench-tables-") as (work, server):
        load(server, args.tables, args.rows)
        one_config = pipeline(server, "one", "big.rows", args.master)
        many_config = pipeline(server, "many", "many.*", args.master)
        figures: dict[str, list[float]] = {
            "one": [],
            "many": [],
            "unchanged": [],
            "changed": [],
            "status": [],
        }
        other = args.compare_with.resolve() if args.compare_with else None
        if other is not None:
            figures.update({"other many": [], "other unchanged": [], "other changed": []})
            listed = {
                **many_config,
                "tables": [{"name": f"many.t{i:04d}"} for i in range(args.tables)],
            }
        for repetition in range(args.repeat):
            figures["one"].append(timed_run(ROOT, fresh_config(work / "one", one_config)).seconds)
            path = fresh_config(work / "many", many_config)
            for name in ("many", "unchanged", "changed"):
                if name == "changed":
                    change_each(server, args.tables, args.rows, repetition)
                timing = timed_run(ROOT, path)
                figures[name].append(timing.seconds)
                print(
                    f"  {name}: {timing.seconds:.1f}s, steps "
                    + ", ".join(f"{step} {seconds:.1f}s" for step, seconds in timing.steps.items()),
                    flush=True,
                )
            figures["status"].append(timed_status(path))
            if other is not None:
                path = fresh_config(work / "other", listed)
                figures["other many"].append(timed_run(other, path).seconds)
                figures["other unchanged"].append(timed_run(other, path).seconds)
                change_each(server, args.tables, args.rows, repetition)
                figures["other changed"].append(timed_run(other, path).seconds)
            print(
                f"repetition {repetition + 1}: "
                + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in figures.items()),
                flush=True,
            )
        one, many = median(figures["one"]), median(figures["many"])
        total = args.tables * args.rows
        print(f"\nmedians of {args.repeat} repetition(s), {total:,} rows:")
        print(f"  one table of {total:,} rows, first run          {one:7.1f}s")
        print(
            f"  {args.tables} tables of {args.rows} rows, first run        {many:7.1f}s   "
            f"ratio {many / one:.2f}x the one table"
        )
        print(
            f"  {args.tables} tables, a run with no change        "
            f"{median(figures['unchanged']):7.1f}s"
        )
        changed = median(figures["changed"])
        print(
            f"  {args.tables} tables, one row of each changed    {changed:7.1f}s   "
            f"ratio {changed / many:.2f}x their first run"
        )
        print(
            f"  {args.tables} tables, tidemark status             {median(figures['status']):7.1f}s"
        )
        if other is not None:
            print(
                f"  {other}: first run {median(figures['other many']):.1f}s, a run with no change "
                f"{median(figures['other unchanged']):.1f}s, one row of each changed "
                f"{median(figures['other changed']):.1f}s (tables listed one by one)"
            )
        print(
            f"(machine: {os.cpu_count()} cores, shared, load average {os.getloadavg()[0]:.1f}; "
            f"master {args.master})"
        )
        with (work / "figures.yaml").open("w") as out:
            yaml.safe_dump(figures, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
