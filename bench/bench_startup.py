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

    .venv/bin/python bench/bench_startup.py --compare-with /tmp/tidemark-main
    .venv/bin/python bench/bench_startup.py --rows 1000000 --changes 2500 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_snapshot import Timing, fresh_config, median, timed_run  # noqa: E402
from bench.shop_lake import load_sample_shop, scratch_server  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=500, help="rows updated per repetition")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR")
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
        configs = {name: fresh_config(work / name, base) for name in checkouts}
        for name, code in checkouts.items():
            timed_run(code, configs[name])  # the snapshot, untimed
        runs: dict[str, list[Timing]] = {
            f"{name} {kind}": [] for name in checkouts for kind in ("changes", "no change")
        }
        for repetition in range(args.repeat):
            changed = spread_update(conn, args.changes, args.rows)
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
    print(f"(load average at the end {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
