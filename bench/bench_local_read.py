"""A small table read by the driver vs by Spark, side by side: where
`orchestrator.pipeline.read.local.LOCAL_ROWS` comes from.

One private MariaDB holds ``shop.orders`` (10 columns of every kind the type mapping converts:
ENUM, DECIMAL, FLOAT, DATETIME(6), TIMESTAMP(6), TINYINT(1), SET, VARCHAR). For each size in
``--sizes`` the first that many rows are read as one chunk, alternately:

- by the driver: `orchestrator.pipeline.read.local.read_table` (PyMySQL through the read SQL,
  pyarrow, one Parquet file);
- by Spark: `jdbc.read_chunks` of the same chunk, one job, on a warm JVM (the session started
  and used once before timing: what a table costs once some other table of the run needed Spark).

It prints the medians, milliseconds a table, and the ratio; the driver wins where the ratio is
above 1. A run of small tables only also saves the JVM's start (``spark session started in``).

    .venv/bin/python bench/bench_local_read.py --sizes 100,1000,10000,50000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import load_sample_shop, scratch_server, write_pipeline  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.lake import iceberg  # noqa: E402
from orchestrator.pipeline.context import spark_session  # noqa: E402
from orchestrator.pipeline.read.jdbc import read_chunks  # noqa: E402
from orchestrator.pipeline.read.local import LocalTable, read_table  # noqa: E402
from orchestrator.source.connection import Source  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="100,1000,10000,50000", help="rows of the table, comma-separated"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with scratch_server("tidemark-bench-local-") as (work, server):
        conn = load_sample_shop(server, max(sizes))
        config = load_config(
            write_pipeline(work, server, name="bench_local", master=args.master, defaults={})
        )
        with Source.from_pipeline(config) as source:
            info = source.table_info("shop.orders")
        schema = iceberg.data_file_schema(config, info)
        spark = spark_session(config)
        results: dict[int, tuple[float, float]] = {}
        with Source.from_pipeline(config) as source:
            for size in sizes:
                where = f"`id` <= {10 * size}"  # the sample's ids are 10, 20, ...
                driver, jvm = [], []
                for n in range(args.repeat + 1):  # the first round warms both up, untimed
                    out = work / f"s{size}-{n}"
                    start = time.perf_counter()
                    read_table(
                        source,
                        LocalTable(
                            info, ("id",), schema, [(0, where, str(out / "driver.parquet"))]
                        ),
                        lambda: None,
                    )
                    driver.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    read_chunks(
                        spark,
                        config,
                        info,
                        [(0, where)],
                        lambda _, o=out: str(o / "spark"),
                        ("id",),
                        schema=schema,
                    )
                    jvm.append(time.perf_counter() - start)
                d, s = statistics.median(driver[1:]), statistics.median(jvm[1:])
                results[size] = (d, s)
                print(
                    f"{size:>8,} rows: driver {d * 1000:8.1f} ms, Spark {s * 1000:8.1f} ms, "
                    f"Spark / driver {s / d:5.2f}x (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        conn.close()
        spark.stop()
    print(f"\nmedians of {args.repeat}, master {args.master}, {os.cpu_count()} cores (shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
