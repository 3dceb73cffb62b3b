"""What an XA transaction on a table outside the pipeline costs when it stays prepared across runs
(an application's transaction left in ``XA PREPARE``, say), beside another checkout.

One private MariaDB holds ``--rows`` orders of the sample shop, and ``shop.xa_outside``, which no
pipeline reads. Each round, for each checkout in turn (the order alternates; say
``git archive <rev> | tar -x -C DIR`` for ``--compare-with DIR``): a fresh lake snapshots
``shop.orders`` (untimed), an XA transaction with a row of ``shop.xa_outside`` is prepared, and
``--runs`` runs each apply ``--changes`` updates spread over every key while it stays prepared;
then it commits, and one more run applies the next updates. Each run is timed as a process of its
own. Before this release, the run after such a commit read every table of the pipeline again
(docs/limits.md had it): the bench prints that run beside the ones before it, and whether it
re-read ``shop.orders``.

    .venv/bin/python bench/bench_xa_outside.py --rows 1000000 --compare-with /tmp/tidemark-main
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
from bench.bench_startup import spread_update  # noqa: E402
from bench.shop_lake import load_sample_shop, scratch_server  # noqa: E402
from orchestrator.app.demo.localdb import LocalMariaDB  # noqa: E402


def prepared(server: LocalMariaDB, xid: str, key: int) -> None:
    """An XA transaction with one row of ``shop.xa_outside``, left prepared."""
    server.execute(
        f"XA START '{xid}'",
        f"INSERT INTO shop.xa_outside VALUES ({key})",
        f"XA END '{xid}'",
        f"XA PREPARE '{xid}'",
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1000, help="rows updated before each run")
    parser.add_argument("--runs", type=int, default=2, help="runs while it stays prepared")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    checkouts = {"this": ROOT}
    if args.compare_with is not None:
        checkouts["other"] = args.compare_with.resolve()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    during: dict[str, list[Timing]] = {name: [] for name in checkouts}
    after: dict[str, list[Timing]] = {name: [] for name in checkouts}
    snapshots: dict[str, list[Timing]] = {name: [] for name in checkouts}
    with scratch_server("tidemark-bench-xa-") as (work, server):
        conn = load_sample_shop(server, args.rows)
        server.execute("CREATE TABLE shop.xa_outside (id INT PRIMARY KEY)")
        base: dict[str, Any] = {
            "pipeline": "xa",
            "source": server.source_config(),
            "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
            "tables": [{"name": "shop.orders"}],
        }
        for round_ in range(args.repeat):
            order = list(checkouts.items())
            for name, code in order if round_ % 2 == 0 else order[::-1]:
                config = fresh_config(work / name, base)
                snapshots[name].append(timed_run(code, config))
                xid = f"bench-{name}-{round_}"
                prepared(server, xid, round_ * 10 + len(name))
                try:
                    for _ in range(args.runs):
                        spread_update(conn, args.changes, args.rows)
                        during[name].append(timed_run(code, config))
                finally:
                    server.execute(f"XA COMMIT '{xid}'")
                spread_update(conn, args.changes, args.rows)
                after[name].append(timed_run(code, config))
                print(
                    f"round {round_ + 1}, {name}: snapshot {snapshots[name][-1].seconds:.2f}s, "
                    f"runs while prepared "
                    + ", ".join(f"{t.seconds:.2f}s" for t in during[name][-args.runs :])
                    + f", the run after its commit {after[name][-1].seconds:.2f}s",
                    flush=True,
                )
        conn.close()
    print(f"\nmedians of {args.repeat} rounds, {args.rows:,} rows (wall s, CPU s of the tree):")
    for name in checkouts:
        print(
            f"  {name:<6} snapshot {median([t.seconds for t in snapshots[name]]):6.2f}s; "
            f"runs while prepared {median([t.seconds for t in during[name]]):6.2f}s "
            f"({median([t.cpu for t in during[name]]):.2f} CPU s); the run after its commit "
            f"{median([t.seconds for t in after[name]]):6.2f}s "
            f"({median([t.cpu for t in after[name]]):.2f} CPU s)   ({checkouts[name]})"
        )
    print(f"(load average at the end {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
