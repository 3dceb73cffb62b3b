"""What a small `tidemark run` costs as a process of its own, beside another checkout: a run with
no change and a run after a few spread changes, wall time and CPU time, interleaved.

One private MariaDB holds ``--rows`` orders of the sample shop. Each checkout (this one, and
``--compare-with DIR``, say ``git archive main | tar -x -C DIR``) has a pipeline of its own
(state and lake) that snapshots ``shop.orders`` once, untimed. Then each repetition updates
``--changes`` rows spread over every key and times, in turn for each checkout (the order
alternates), the run that applies them and then a run with no change. Wall time is from the start
of the process to its end; CPU time is the process tree's (`bench.bench_snapshot.TreeSampler`),
not the server's. The start-up (interpreter, imports, connections) is most of both runs at small
sizes (docs/performance.md, "Incremental").

``--mix`` makes each repetition's changes the incremental benchmark's mix instead of updates
(`bench.bench_incremental.apply_changes`, ``uniform``: inserts above and between the keys,
updates, deletes, key changes, spread over every key), and times each checkout's snapshot too:
the run that applies them is then printed as a fraction of its snapshot, the figure of issue
34's goal 4 (10,000 such changes over 4M rows, a tenth of the snapshot at most). A snapshot's
time moves with the machine more than the run's (14-21 s for 4M rows here, a day apart):
``--snapshots N`` takes each checkout's snapshot N times, the checkouts in turn, into a fresh
lake each time (the repetitions go on from the last), and the fraction is of their median.

    .venv/bin/python bench/bench_startup.py --compare-with /tmp/tidemark-main
    .venv/bin/python bench/bench_startup.py --rows 1000000 --changes 2500 --repeat 5
    .venv/bin/python bench/bench_startup.py --rows 4000000 --changes 10000 --mix --repeat 8 \
        --snapshots 3 --compare-with /tmp/tidemark-main
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_incremental import apply_changes  # noqa: E402
from bench.bench_snapshot import Timing, fresh_config, median, timed_run  # noqa: E402
from bench.shop_lake import load_sample_shop, scratch_server  # noqa: E402

#: Where ``--mix`` puts the keys it inserts between existing ones (``10 * k + between``), a
#: different place each repetition so that no insert meets an earlier one.
BETWEEN = (1, 2, 3, 4, 6, 7, 8, 9)


def spread_update(conn: Any, changes: int, rows: int) -> int:
    """Update about ``changes`` rows spread over every key (every ``rows // changes``-th row in
    key order)."""
    step = max(rows // max(changes, 1), 1)
    with conn.cursor() as cur:
        done = cur.execute(
            "UPDATE shop.orders SET amount = amount + 1 WHERE id IN (SELECT id FROM ("
            "SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS n FROM shop.orders) AS numbered "
            f"WHERE n % {step} = {step // 2})"
        )
    conn.commit()
    return int(done)


def mixed_changes(conn: Any, changes: int, rows: int, repetition: int) -> int:
    """``changes`` of the incremental benchmark's mix spread over every key; inserts above the
    keys of earlier repetitions, and between the keys where none went before. The count
    returned is what was applied (a retry after a key met may apply more)."""
    conn.select_db("shop")
    applied = 0
    for attempt in range(len(BETWEEN)):
        try:
            done = apply_changes(
                conn,
                rows,
                "uniform",
                changes,
                seed=100 + repetition + 1000 * attempt,
                top=10 * rows + 100_000 * (repetition + 1) + 20_000 * attempt,
                between=BETWEEN[(repetition + attempt) % len(BETWEEN)],
            )
            return applied + sum(done.values())
        except Exception as exc:  # a key an earlier repetition inserted: other places
            if "Duplicate" not in str(exc):
                raise
            applied += changes  # at most: what went before the duplicate stays (autocommit)
    raise SystemExit(f"--mix: no free keys for repetition {repetition + 1}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=500, help="rows updated per repetition")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--mix", action="store_true", help="the incremental benchmark's mix, snapshots timed"
    )
    parser.add_argument(
        "--snapshots", type=int, default=1, help="snapshots of each checkout (their median)"
    )
    args = parser.parse_args()
    checkouts = {"this": ROOT}
    if args.compare_with is not None:
        checkouts["other"] = args.compare_with.resolve()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    with scratch_server("tidemark-bench-startup-") as (work, server):
        conn = load_sample_shop(server, args.rows)
        base = {
            "pipeline": "startup",
            "source": server.source_config(),
            "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
            "tables": [{"name": "shop.orders"}],
        }
        configs: dict[str, Path] = {}  # each snapshot's: a fresh lake (`fresh_config`) each time
        snapshots: dict[str, list[Timing]] = {name: [] for name in checkouts}
        for attempt in range(max(1, args.snapshots)):
            for name, code in checkouts.items():
                configs[name] = fresh_config(work / name, base)
                snapshots[name].append(timed_run(code, configs[name]))
            print(
                f"snapshot {attempt + 1}: "
                + ", ".join(f"{n} {t[-1].seconds:.2f}s" for n, t in snapshots.items()),
                flush=True,
            )
        runs: dict[str, list[Timing]] = {
            f"{name} {kind}": [] for name in checkouts for kind in ("changes", "no change")
        }
        for repetition in range(args.repeat):
            changed = (
                mixed_changes(conn, args.changes, args.rows, repetition)
                if args.mix
                else spread_update(conn, args.changes, args.rows)
            )
            order = list(checkouts.items())
            for name, code in order if repetition % 2 == 0 else order[::-1]:  # neither always first
                runs[f"{name} changes"].append(timed_run(code, configs[name]))
                runs[f"{name} no change"].append(timed_run(code, configs[name]))
            print(
                f"repetition {repetition + 1} ({changed} rows changed): "
                + ", ".join(
                    f"{k} {v[-1].seconds:.2f}s/{v[-1].cpu:.2f} CPU s" for k, v in runs.items()
                ),
                flush=True,
            )
        conn.close()
    print(f"\nmedians of {args.repeat}, {args.rows:,} rows (wall s, CPU s of the process tree):")
    for label, timings in runs.items():
        wall = median([t.seconds for t in timings])
        cpu = median([t.cpu for t in timings])
        print(f"  {label:<22} {wall:6.2f}s {cpu:6.2f} CPU s   ({checkouts[label.split()[0]]})")
    if args.mix:
        for name, taken in snapshots.items():
            run = median([t.seconds for t in runs[f"{name} changes"]])
            snapshot = median([t.seconds for t in taken])
            print(
                f"  {name}: the run after the changes {run:.2f}s, its snapshot {snapshot:.2f}s "
                f"(median of {len(taken)}): {run / snapshot:.3f} of it"
            )
    print(f"(load average at the end {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
