"""Every Tidemark benchmark in one run, then the ratios they printed, together.

Runs, one after the other (never side by side with each other, so they do not
share the two cores), each script of ``bench/`` with the sizes given here:

- ``bench_vs_dump.py``: `tidemark run` vs the plain Spark JDBC dump on one table (snapshot,
  spread and recent changes, each run as a process of its own and in a process that ran
  before, as `run --every` does; 1M updated rows vs ``mariadb-binlog``), at 1M and 4M rows;
- ``bench_read.py``: the read alone, warm, vs the plain dump's (wall and CPU seconds);
- ``bench_snapshot.py``: `tidemark run` end to end vs a raw ``mariadb --quick`` scan;
- ``bench_binlog.py``: the capture vs ``mariadb-binlog -vv`` and vs python-mysql-replication;
- ``bench_incremental.py``: an incremental run of a few changes vs the initial snapshot;
- ``bench_memory.py``: peak RSS of a snapshot at two table sizes;
- ``bench_rewrite.py``: the driver's rewrite alone, per variant of the data files' options.

Each script's own output is printed as it comes; the summary at the end repeats
every line that carries a ratio or a peak. ``--quick`` uses small sizes (a smoke
run of the scripts, not figures for docs/performance.md).

    .venv/bin/python bench/run_all.py
    .venv/bin/python bench/run_all.py --quick
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUMMARY_WORDS = ("ratio", "peak")


def benches(quick: bool) -> list[tuple[str, list[str]]]:
    """(title, script and arguments) of each benchmark, at full or quick sizes."""
    if quick:
        return [
            ("vs_dump", ["bench_vs_dump.py", "--quick"]),
            ("read", ["bench_read.py", "--rows", "100000", "--repeat", "1"]),
            ("snapshot", ["bench_snapshot.py", "--rows", "100000"]),
            ("binlog", ["bench_binlog.py", "--changes", "20000"]),
            ("incremental", ["bench_incremental.py", "--rows", "100000", "--changes", "1000"]),
            ("memory", ["bench_memory.py", "--small", "50000", "--large", "200000"]),
            (
                "rewrite",
                ["bench_rewrite.py", "--rows", "200000", "--changes", "500", "--repeat", "2"],
            ),
        ]
    return [
        ("vs_dump", ["bench_vs_dump.py", "--rows", "1000000", "--repeat", "3"]),
        ("vs_dump_4m", ["bench_vs_dump.py", "--rows", "4000000", "--repeat", "3"]),
        ("read", ["bench_read.py", "--rows", "1000000", "--repeat", "5"]),
        ("snapshot", ["bench_snapshot.py", "--rows", "1000000", "--repeat", "3"]),
        ("binlog", ["bench_binlog.py", "--changes", "500000"]),
        ("incremental", ["bench_incremental.py", "--rows", "5000000", "--changes", "10000"]),
        ("memory", ["bench_memory.py", "--small", "1000000", "--large", "10000000"]),
        (
            "rewrite",
            ["bench_rewrite.py", "--rows", "4000000", "--changes", "10000", "--repeat", "6"],
        ),
    ]


def run(title: str, argv: list[str]) -> tuple[int, list[str]]:
    """Run one benchmark script, echoing its output; returns its exit code and lines."""
    print(f"\n===== {title}: {' '.join(argv)}", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, str(HERE / argv[0]), *argv[1:]],
        cwd=HERE.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    code = process.wait()
    print(f"===== {title}: exit {code} after {time.monotonic() - started:.0f}s", flush=True)
    return code, lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: check the scripts run")
    parser.add_argument(
        "--compare-with",
        metavar="DIR",
        help="another checkout, timed side by side by the snapshot benchmark",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only this benchmark "
        "(vs_dump, vs_dump_4m, read, snapshot, binlog, incremental, memory)",
    )
    args = parser.parse_args()
    summary: list[str] = []
    failed = []
    for title, argv in benches(args.quick):
        if args.only and title not in args.only:
            continue
        if title == "snapshot" and args.compare_with:
            argv = [*argv, "--compare-with", args.compare_with]
        code, lines = run(title, argv)
        if code != 0:
            failed.append(title)
        summary += [
            f"{title:<12} {line.strip()}"
            for line in lines
            if any(word in line for word in SUMMARY_WORDS)
        ]
    print(
        f"\n===== summary (machine: {os.cpu_count()} cores, load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())})"
    )
    print("\n".join(summary) if summary else "(no ratios printed)")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
