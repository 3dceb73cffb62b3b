r"""Publishing many small tables, without a server or Spark, side by side with another checkout.

Publish is the step of a first run of many small tables whose cost grows with the tables and
not the rows (issue 16): an Iceberg table created and committed, manifests written and switched,
per table. This times `versions.publish_table` alone, as the publish step calls it (one catalog
for all the tables, the SQLite catalog of the state store), on ``--tables`` tables of
``--rows`` rows whose staging files pyarrow wrote beforehand (not timed):

- the first version of each table (a table new to the catalog);
- a second version of each (an existing table: a snapshot replacing its files).

Each checkout runs in a fresh process per repetition, the two alternating, so both meet the
same load; it prints medians of wall and CPU milliseconds per table and the ratios.

    .venv/bin/python bench/bench_publish.py --tables 200 --repeat 5 \
        --compare-with /tmp/tidemark-main
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSES = ("first", "second")


def child(tables: int, rows: int, work: Path) -> dict[str, list[float]]:
    """Publish every table twice with the checkout first on ``sys.path``; wall and CPU seconds per
    pass."""
    from orchestrator.config import parse_config
    from orchestrator.lake import iceberg

    try:
        from orchestrator.pipeline.publish.versions import publish_table
    except ImportError:  # a checkout from before pipeline/versions.py
        from orchestrator.pipeline.publish.step import publish_table  # type: ignore[attr-defined,no-redef]
    from orchestrator.positions import BinlogPosition
    from orchestrator.schema.tables import TableInfo
    from tests.unit.test_manifest import COLUMNS, write_staging

    infos = [TableInfo("db", f"t{i:04d}", COLUMNS, ("id",), (), 0) for i in range(tables)]
    config = parse_config(
        {
            "pipeline": "p",
            "source": {"host": "h", "user": "u", "server_id": 1},
            "output": {"path": str(work / "lake"), "keep_versions": 2, "keep_hours": 0},
            "state": {"url": f"sqlite:///{work / 'state.db'}"},
            "tables": [{"name": "db.*"}],
        },
        check_env=False,
    )
    catalog = iceberg.open_catalog(config)
    out: dict[str, list[float]] = {}
    for n, name in enumerate(PASSES, start=1):
        staged = [
            write_staging(
                work / name / info.table,
                [{"id": i, "d": None, "t": i * n, "big": f"{i}.{n:02d}"} for i in range(rows)],
            )
            for info in infos
        ]
        wall, cpu = time.perf_counter(), time.process_time()
        for info, directory in zip(infos, staged, strict=True):
            publish_table(
                config,
                info,
                ("id",),
                directory,
                BinlogPosition("binlog.000001", 4 + n),
                f"run-{n}",
                catalog=catalog,
            )
        out[name] = [time.perf_counter() - wall, time.process_time() - cpu]
    return out


def timed(code: Path, tables: int, rows: int, scratch: Path) -> dict[str, list[float]]:
    """One child process of the checkout at ``code`` in a fresh work dir under ``scratch``,
    deleted only when the benchmark ends (`bench_snapshot.discard` says why)."""
    work = Path(tempfile.mkdtemp(prefix="child-", dir=scratch))
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_publish.py"),
            "--child",
            str(work),
            "--tables",
            str(tables),
            "--rows",
            str(rows),
        ],
        env=env,
        cwd=code,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.tables, args.rows, args.child)))
        return 0
    codes = {"this": ROOT} | ({"other": args.compare_with.resolve()} if args.compare_with else {})
    figures: dict[str, dict[str, list[list[float]]]] = {c: {p: [] for p in PASSES} for c in codes}
    scratch = Path(tempfile.mkdtemp(prefix="tidemark-bench-publish-"))
    try:
        for repetition in range(args.repeat):
            for code, path in codes.items():
                for name, seconds in timed(path, args.tables, args.rows, scratch).items():
                    figures[code][name].append(seconds)
            print(
                f"repetition {repetition + 1} (load {os.getloadavg()[0]:.1f}): "
                + "; ".join(
                    f"{code} {name} {figures[code][name][-1][0] * 1000 / args.tables:.1f} ms"
                    for code in codes
                    for name in PASSES
                ),
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"\nmedians of {args.repeat}, ms per table (wall / CPU), "
        f"{args.tables} tables of {args.rows} rows:"
    )
    for name in PASSES:
        line = {
            c: [
                statistics.median(s[i] for s in figures[c][name]) * 1000 / args.tables
                for i in (0, 1)
            ]
            for c in codes
        }
        text = "  ".join(f"{c} {w:6.1f} / {u:6.1f}" for c, (w, u) in line.items())
        if "other" in line:
            text += (
                f"   ratio this/other {line['this'][0] / line['other'][0]:.2f} wall, "
                f"{line['this'][1] / line['other'][1]:.2f} CPU"
            )
        print(f"  {name:<7} {text}")
    print(f"(machine: {os.cpu_count()} cores, shared, load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
