"""The read alone, warm: Tidemark's chunk reads vs the plain Spark JDBC dump, in one SparkSession.

Both read ``shop.orders`` of a private MariaDB into Parquet on the same warm JVM (no session
start, no planning, no binlog, no publish), alternately, ``--repeat`` times; the medians and
their ratio are printed. It isolates what the read does that the plain dump does not (the
server-side conversions, sorting each chunk, field IDs, required columns, one job per batch),
so each tuning of `orchestrator.pipeline.read.jdbc` can be measured on its own, side by side.

- plain: ``spark.read.jdbc(url, table, column="id", lowerBound, upperBound, numPartitions=N)``
  then ``write.parquet`` (``--dump-partitions``, default 8; fetch size 10,000);
- tidemark: `jdbc.read_chunks` over chunks of ``--chunk-size`` ids, ``--batch-chunks`` per
  job, `orchestrator.app.run.READ_CONCURRENCY` jobs at once, as `tidemark run` reads.

    .venv/bin/python bench/bench_read.py --rows 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import load_sample_shop, scratch_server, write_pipeline  # noqa: E402
from orchestrator.app.run import READ_CONCURRENCY  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.pipeline.context import spark_session  # noqa: E402
from orchestrator.pipeline.read.jdbc import jdbc_properties, read_chunks  # noqa: E402
from orchestrator.source.connection import Source  # noqa: E402


class Cpu:
    """CPU seconds of this process tree (the driver JVM) and of the MariaDB server, since the last
    call."""

    def __init__(self, server_pid: int) -> None:
        self.procs = [psutil.Process(), psutil.Process(server_pid)]
        self.last = self.total()

    def total(self) -> float:
        seconds = 0.0
        for proc in [*self.procs, *self.procs[0].children(recursive=True)]:
            times = proc.cpu_times()
            seconds += times.user + times.system
        return seconds

    def lap(self) -> float:
        now = self.total()
        spent, self.last = now - self.last, now
        return spent


def plain(spark: Any, config: Any, out: Path, partitions: int, bounds: tuple[int, int]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    props = jdbc_properties(config, "org.mariadb.jdbc.Driver")
    props = {k: props[k] for k in ("driver", "user", "password", "fetchsize")}
    start = time.perf_counter()
    url = f"jdbc:mysql://{config.source.host}:{config.source.port}/"  # what a Spark user writes
    df = spark.read.jdbc(
        url,
        "shop.orders",
        column="id",
        lowerBound=bounds[0],
        upperBound=bounds[1] + 1,
        numPartitions=partitions,
        properties=props,
    )
    df.write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - start


def tidemark(
    spark: Any, config: Any, info: Any, out: Path, chunks: list[tuple[int, str]], per_batch: int
) -> float:
    shutil.rmtree(out, ignore_errors=True)
    batches = [chunks[i : i + per_batch] for i in range(0, len(chunks), per_batch)]
    start = time.perf_counter()
    with ThreadPoolExecutor(READ_CONCURRENCY) as pool:
        list(
            pool.map(
                lambda b: read_chunks(
                    spark, config, info, b, lambda i: str(out / f"chunk-{i:06d}"), ("id",)
                ),
                batches,
            )
        )
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=50_000)
    parser.add_argument("--batch-chunks", type=int, default=16)
    parser.add_argument("--dump-partitions", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    with scratch_server("tidemark-bench-read-") as (work, server):
        conn = load_sample_shop(server, args.rows)
        config = load_config(
            write_pipeline(work, server, name="bench_read", master=args.master, defaults={})
        )
        with Source.from_pipeline(config) as source:
            info = source.table_info("shop.orders")
        top = 10 * args.rows
        step = 10 * args.chunk_size
        chunks = [
            (n, f"`id` >= {low} AND `id` < {low + step}")
            for n, low in enumerate(range(0, top + 1, step))
        ]
        spark = spark_session(config)
        spark.range(1).count()
        tidemark(spark, config, info, work / "warm", chunks[:2], args.batch_chunks)  # JIT, catalog
        plains, ours, plain_cpu, our_cpu = [], [], [], []
        cpu = Cpu(int(server.pid_file.read_text().strip()))
        for n in range(args.repeat):
            cpu.lap()
            plains.append(plain(spark, config, work / "plain", args.dump_partitions, (10, top)))
            plain_cpu.append(cpu.lap())
            ours.append(tidemark(spark, config, info, work / "ours", chunks, args.batch_chunks))
            our_cpu.append(cpu.lap())
            print(
                f"repetition {n + 1}: plain {plains[-1]:.2f}s ({plain_cpu[-1]:.1f} CPU s), "
                f"tidemark {ours[-1]:.2f}s "
                f"({our_cpu[-1]:.1f} CPU s) (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        size = {
            name: sum(f.stat().st_size for f in (work / name).rglob("*.parquet")) / 2**20
            for name in ("plain", "ours")
        }
        print(f"output: plain {size['plain']:.1f} MiB, tidemark {size['ours']:.1f} MiB")
        p, t = statistics.median(plains), statistics.median(ours)
        pc, tc = statistics.median(plain_cpu), statistics.median(our_cpu)
        print(
            f"\n{args.rows:,} rows, warm JVM, master {args.master}: "
            f"plain dump ({args.dump_partitions} partitions)"
            f" {p:.2f}s, tidemark reads ({len(chunks)} chunks) {t:.2f}s: ratio {p / t:.2f}x; "
            "CPU seconds "
            f"(driver JVM + MariaDB) {pc:.1f} vs {tc:.1f}: ratio {pc / tc:.2f}x"
        )
        conn.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
