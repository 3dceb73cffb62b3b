"""Peak memory of a snapshot: driver JVM + Python, at two table sizes, side by side.

Loads ``shop.orders`` twice into one private MariaDB (``--small`` and
``--large`` rows, in databases ``mem_small`` and ``mem_large``), then snapshots
each with `tidemark run` on Tidemark's defaults (streamed JDBC reads, Spark's
default 1 GB driver heap) while sampling the resident set size of the run's
whole process tree (Python, the driver JVM, any Python workers) every 50 ms.
Reads stream and Spark's memory is bounded, so the peak must not grow with the
table: the printed ratio large/small should stay near 1.

    .venv/bin/python bench/bench_memory.py --small 1000000 --large 10000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

# bench/ is on the path as the script's directory; bench_snapshot puts the checkout there too.
from bench_snapshot import ROOT, Timing, fresh_config, pipeline, timed_run

from bench.shop_lake import scratch_server
from orchestrator.app.demo.sample import connect, load_shop

MB = 1024 * 1024


def measured_run(config_path: Path) -> Timing:
    """`tidemark run` of this checkout with its process tree sampled (see `TreeSampler`)."""
    return timed_run(ROOT, config_path)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per size, alternating (medians printed)"
    )
    args = parser.parse_args()

    with scratch_server("tidemark-bench-mem-") as (work, server):
        sizes = {"small": args.small, "large": args.large}
        conn = connect("127.0.0.1", server.port, "root", "")
        for label, rows in sizes.items():
            started = time.perf_counter()
            load_shop(conn, rows, db=f"mem_{label}")
            print(
                f"loaded {rows:,} rows into mem_{label}.orders "
                f"in {time.perf_counter() - started:.0f}s",
                flush=True,
            )
        conn.close()
        peaks: dict[str, list[Timing]] = {label: [] for label in sizes}
        for _ in range(args.repeat):
            for label in sizes:
                config = pipeline(
                    work, server, master="local[2]", chunk_size=None, batch_chunks=None
                )
                config["tables"] = [{"name": f"mem_{label}.orders"}]
                peak = measured_run(fresh_config(work / "run", config))
                peaks[label].append(peak)
                print(
                    f"{label}: {peak.seconds:.0f}s, peak {peak.peak_rss / MB:,.0f} MiB "
                    f"(JVM {peak.peak_jvm / MB:,.0f}, Python {peak.peak_python / MB:,.0f})",
                    flush=True,
                )

        def mib(label: str, part: str) -> float:
            return statistics.median(getattr(p, part) for p in peaks[label]) / MB

        print(f"\npeak RSS of `tidemark run` (driver JVM + Python), medians of {args.repeat}:")
        for label, rows in sizes.items():
            seconds = statistics.median(p.seconds for p in peaks[label])
            print(
                f"  {rows:>12,} rows  {mib(label, 'peak_rss'):7,.0f} MiB   "
                f"(JVM {mib(label, 'peak_jvm'):,.0f},"
                f" Python {mib(label, 'peak_python'):,.0f})   run {seconds:.0f}s"
            )
        ratio = mib("large", "peak_rss") / mib("small", "peak_rss")
        print(
            f"  ratio {args.large:,} / {args.small:,} rows: {ratio:.2f}x"
            f"  (machine: {os.cpu_count()} cores, shared)"
        )
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
