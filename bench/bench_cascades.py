"""Derived cascades vs the same changes made explicitly: `tidemark run` end to end, side by side.

Two copies of a parent (``--parents`` rows, default 100,000) and a child (``--rows``, default
1,000,000: about 10 children a parent) in a private MariaDB: in ``casc`` the child's foreign key
is ``ON DELETE CASCADE``, in ``expl`` there is none. Both pipelines are snapshotted, then each
round deletes ``--deletes`` parents (default 1,000) from both: in ``casc`` InnoDB deletes their
~10,000 children itself and the binlog holds only the parent rows (Tidemark derives the child
deletes from the child's published version), in ``expl`` the children are deleted by an explicit
statement first, so the binlog holds every row. The incremental runs of the two pipelines, each
its own process as a user runs it, alternate round by round; prints each round's times, the
medians and their ratio (derived / explicit), and checks both lakes equal their sources.

    .venv/bin/python bench/bench_cascades.py
    .venv/bin/python bench/bench_cascades.py --rows 200000 --parents 20000 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import scratch_server  # noqa: E402

SCHEMA = {
    "casc": "CONSTRAINT c_p FOREIGN KEY (pid) REFERENCES p (id) ON DELETE CASCADE",
    "expl": "KEY k_pid (pid)",
}


def tidemark_run(config: Path) -> float:
    """Seconds of one ``tidemark run`` of ``config`` in its own process (exit 0 checked)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"tidemark run of {config} failed:\n{done.stderr[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="child rows")
    parser.add_argument("--parents", type=int, default=100_000)
    parser.add_argument("--deletes", type=int, default=1_000, help="parents deleted a round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from orchestrator.app.demo.verify import verify_table
    from orchestrator.config import load_config
    from orchestrator.pipeline.context import table_dir
    from orchestrator.source.connection import Source

    with scratch_server("tidemark-bench-cascades-") as (work, server):
        started = time.perf_counter()
        for db, key in SCHEMA.items():
            server.execute(f"CREATE DATABASE {db}")
            server.execute(
                f"CREATE TABLE {db}.p (id INT PRIMARY KEY, name VARCHAR(20))",
                f"CREATE TABLE {db}.c (id INT PRIMARY KEY, pid INT NOT NULL, qty INT,"
                f" note VARCHAR(40), {key})",
                f"INSERT INTO {db}.p SELECT seq, CONCAT('parent ', seq)"
                f" FROM seq_1_to_{args.parents}",
                f"INSERT INTO {db}.c SELECT seq, 1 + seq % {args.parents}, seq % 97,"
                f" CONCAT('child ', seq) FROM seq_1_to_{args.rows}",
                database=db,
            )
        print(
            f"loaded 2 x ({args.parents:,} parents, {args.rows:,} children) in "
            f"{time.perf_counter() - started:.0f}s",
            flush=True,
        )
        configs = {}
        for db in SCHEMA:
            path = work / f"{db}.yaml"
            path.write_text(
                yaml.safe_dump(
                    {
                        "pipeline": db,
                        "source": server.source_config(),
                        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
                        "output": {"path": str(work / db / "lake")},
                        "state": {"url": f"sqlite:///{work / db / 'state.db'}"},
                        "tables": [{"name": f"{db}.p"}, {"name": f"{db}.c"}],
                    }
                )
            )
            (work / db).mkdir(exist_ok=True)
            configs[db] = path
            print(f"snapshot {db}: {tidemark_run(path):.1f}s", flush=True)
        rng = random.Random(32)
        alive = list(range(1, args.parents + 1))
        rng.shuffle(alive)
        times: dict[str, list[float]] = {db: [] for db in SCHEMA}
        for round_ in range(args.rounds):
            gone = ", ".join(str(alive.pop()) for _ in range(args.deletes))
            server.execute(f"DELETE FROM casc.p WHERE id IN ({gone})")
            server.execute(
                f"DELETE FROM expl.c WHERE pid IN ({gone})",
                f"DELETE FROM expl.p WHERE id IN ({gone})",
            )
            order = list(SCHEMA) if round_ % 2 == 0 else list(reversed(SCHEMA))
            for db in order:
                times[db].append(tidemark_run(configs[db]))
            load = os.getloadavg()[0]
            print(
                f"round {round_ + 1}: derived {times['casc'][-1]:.2f}s, explicit "
                f"{times['expl'][-1]:.2f}s (load {load:.1f})",
                flush=True,
            )
        derived, explicit = (statistics.median(times[db]) for db in ("casc", "expl"))
        ratios = [d / e for d, e in zip(times["casc"], times["expl"], strict=True)]
        print(
            f"median incremental run: derived {derived:.2f}s, explicit {explicit:.2f}s: "
            f"{derived / explicit:.2f}x; median of the rounds' ratios "
            f"{statistics.median(ratios):.2f}x ({args.deletes:,} parent deletes a round, "
            f"~{args.deletes * args.rows // args.parents:,} child rows; {args.rows:,}-row child)"
        )
        conn = server.connect()
        try:
            for db, path in configs.items():
                config = load_config(path)
                with Source.from_pipeline(config) as source:
                    for table in (f"{db}.p", f"{db}.c"):
                        info = source.table_info(table)
                        result = verify_table(
                            conn, info, info.primary_key, table_dir(config, table)
                        )
                        print(result.summary())
                        if not result.equal:
                            return 1
        finally:
            conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
