"""Tidemark vs the plain Spark JDBC dump, side by side on one table: snapshot, spread and recent
changes.

The job a Spark user writes without Tidemark is one partitioned read and one write::

    spark.read.jdbc(url, "shop.orders", column="id", lowerBound=min, upperBound=max,
                    numPartitions=N, properties={..., "fetchsize": "10000"}).write.parquet(out)

It is inconsistent under writes (each partition sees another moment) and has no binlog.
This script runs it and `tidemark run` on the same private MariaDB and table, one after the
other, each in its own process with its own JVM (as a user runs either), on the same Spark
master and driver memory, and prints the ratios docs/performance.md reports:

1. ``mariadb --quick`` scan (the source's own rate, for scale);
2. the plain dump (``--dump-partitions``, default 8: a partition per quarter core is
   what Spark users are told to try first; pass several to take the fastest);
3. ``tidemark run``: the snapshot (fresh state and lake);
4. ``--changes`` (default 0.25% of the rows) changes spread over every key
   (`bench_incremental.apply_changes`, pattern ``uniform``: inserts above and between,
   updates, deletes, key changes), then ``tidemark run``;
5. as many changes among the newest keys (pattern ``recent``), then ``tidemark run``;
   4 and 5 are timed twice: a run in its own process (a cron job, an Airflow task) and a
   run of a process that has run before (`tidemark run --every`: its imports done, its Spark
   session up), which keeps a second lake of the same table (`WarmRuns`);
6. ``--binlog-rows`` (default 1,000,000, at most the table) rows updated in one statement,
   alone in a binlog file: ``mariadb-binlog --base64-output=DECODE-ROWS -vv`` on that file
   vs the ``tidemark run`` that applies it (capture, reconcile, publish), ``--repeat`` times
   (medians);

and verifies the published table against the source at the end (``--no-verify`` skips it).
Each figure comes with the load average it was taken under (the machine is shared).

    .venv/bin/python bench/bench_vs_dump.py --rows 1000000
    .venv/bin/python bench/bench_vs_dump.py --rows 4000000 --repeat 3
    .venv/bin/python bench/bench_vs_dump.py --quick        # smoke run: 50k rows
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_incremental import apply_changes  # noqa: E402
from bench.bench_snapshot import Timing, TreeSampler, fresh_config, run_env, timed_scan  # noqa: E402
from bench.shop_lake import load_sample_shop, scratch_server  # noqa: E402
from orchestrator.app.demo.localdb import LocalMariaDB  # noqa: E402

TABLE = "shop.orders"
JAR = "/usr/share/java/mariadb-java-client.jar"

#: The plain dump, as a Spark user writes it (a script of its own, run by this interpreter).
_DUMP = """
import sys, time
from pyspark.sql import SparkSession
url, user, out, partitions, low, high, master, memory = sys.argv[1:9]
spark = (SparkSession.builder.master(master).appName("plain-dump")
         .config("spark.jars", {jar!r}).config("spark.driver.extraClassPath", {jar!r})
         .config("spark.driver.memory", memory).config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
df = spark.read.jdbc(url, {table!r}, column="id", lowerBound=int(low), upperBound=int(high) + 1,
                     numPartitions=int(partitions),
                     properties={{"user": user, "password": "", "driver": "org.mariadb.jdbc.Driver",
                                 "fetchsize": "10000"}})
df.write.mode("overwrite").parquet(out)
"""


def load() -> str:
    """The 1-minute load average, as printed next to every figure."""
    return f"{os.getloadavg()[0]:.1f}"


LOGS: Path | None = None  # --logs: each run's stderr is saved there


def timed(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, name: str = ""
) -> Timing:
    """Run ``cmd`` in its own process; its wall time, CPU and peak memory (process tree)."""
    started = time.perf_counter()
    child = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    sampler = TreeSampler(child.pid)
    try:
        _, stderr = child.communicate()
    finally:
        timing = sampler.close(Timing(time.perf_counter() - started))
    if LOGS is not None and name:
        LOGS.mkdir(parents=True, exist_ok=True)
        (LOGS / f"{name}.log").write_text(stderr)
    if child.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd[:3])} ... failed with {child.returncode}:\n{stderr[-3000:]}"
        )
    return timing


def plain_dump(
    server: LocalMariaDB,
    out: Path,
    partitions: int,
    master: str,
    memory: str,
    bounds: tuple[int, int],
) -> Timing:
    """The plain partitioned dump of `TABLE` into ``out`` (replaced)."""
    shutil.rmtree(out, ignore_errors=True)
    script = _DUMP.format(jar=JAR, table=TABLE)
    url = f"jdbc:mysql://127.0.0.1:{server.port}/"
    return timed(
        [
            sys.executable,
            "-c",
            script,
            url,
            "root",
            str(out),
            str(partitions),
            str(bounds[0]),
            str(bounds[1]),
            master,
            memory,
        ],
        name=f"dump-{partitions}",
    )


def tidemark(config_path: Path, name: str) -> Timing:
    """One `tidemark run` of this checkout in its own process."""
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--config",
        str(config_path),
        "--no-progress",
    ]
    timing = timed(cmd, env=run_env(ROOT), cwd=ROOT, name=name)
    if LOGS is not None:  # the run's own log file, next to its SQLite state store
        logs = sorted((config_path.parent / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
        if logs:
            shutil.copy(logs[-1], LOGS / f"{name}.log")
    return timing


#: A process that snapshots, runs once more (nothing to apply), then runs whenever told,
#: timing each run: what `tidemark run --every` does between its runs, on demand.
_WARM = """
import contextlib, gc, sys, time
from orchestrator.app.cli import main
args = ["run", "--config", sys.argv[1], "--no-progress"]
with contextlib.redirect_stdout(sys.stderr):
    for _ in range(2):
        assert main(args) == 0
gc.freeze()  # as the CLI does once its imports are done (cli._imported)
print("ready", flush=True)
for _ in sys.stdin:
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        code = main(args)
    print(time.perf_counter() - start, code, flush=True)
"""


class WarmRuns:
    """A long-lived process with a lake of its own (`_WARM`), timing a run when asked."""

    def __init__(self, work: Path, config: dict[str, Any]) -> None:
        path = fresh_config(work, config)
        self.log = (LOGS / "warm.log").open("w") if LOGS is not None else subprocess.DEVNULL
        self.child = subprocess.Popen(
            [sys.executable, "-c", _WARM, str(path)],
            env=run_env(ROOT),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self._expect("ready")

    def run(self) -> float:
        assert self.child.stdin is not None
        self.child.stdin.write("go\n")
        self.child.stdin.flush()
        seconds, code = self._expect().split()
        if code != "0":
            raise SystemExit(f"a warm run failed with {code}")
        return float(seconds)

    def _expect(self, what: str | None = None) -> str:
        assert self.child.stdout is not None
        line = self.child.stdout.readline().strip()
        if not line or (what is not None and line != what):
            self.child.kill()
            raise SystemExit(f"the warm process ended ({line!r}); see its log (--logs)")
        return line

    def close(self) -> None:
        if self.child.stdin is not None:
            self.child.stdin.close()
        self.child.wait(timeout=120)


def pipeline(
    work: Path, server: LocalMariaDB, master: str, memory: str, chunk_size: int | None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "pipeline": "bench",
        "source": server.source_config(),
        "spark": {
            "master": master,
            "conf": {"spark.ui.enabled": "false", "spark.driver.memory": memory},
        },
        "output": {"path": str(work / "lake")},
        "state": {"url": f"sqlite:///{work / 'state.db'}"},
        "tables": [{"name": TABLE}],
    }
    if chunk_size:
        config["defaults"] = {"chunk_size": chunk_size}
    return config


def apply_updates(
    server: LocalMariaDB, conn: Any, config_path: Path, count: int
) -> tuple[int, float, Timing, str]:
    """Update ``count`` rows in one statement, alone in a fresh binlog file; then time
    ``mariadb-binlog --base64-output=DECODE-ROWS -vv`` on that file and the `tidemark run` that
    applies it (capture, reconcile, publish)."""
    with conn.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        binlog = server.datadir / cur.fetchone()[0]
        done = cur.execute(
            f"UPDATE {TABLE} SET amount = amount + 1, note = 'updated' ORDER BY id LIMIT {count}"
        )
        cur.execute("FLUSH BINARY LOGS")
    conn.commit()
    tool = shutil.which("mariadb-binlog") or "/usr/bin/mariadb-binlog"
    decode = timed(
        [tool, "--no-defaults", "--base64-output=DECODE-ROWS", "-vv", str(binlog)]
    ).seconds
    return done, decode, tidemark(config_path, "binlog"), load()


def key_bounds(conn: Any) -> tuple[int, int]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT MIN(id), MAX(id) FROM {TABLE}")
        low, high = cur.fetchone()
    return int(low), int(high)


def verify(config_path: Path, conn: Any, work: Path) -> bool:
    from orchestrator.app.demo.verify import verify_table
    from orchestrator.config import load_config
    from orchestrator.source.connection import Source

    with Source.from_pipeline(load_config(config_path)) as source:
        info = source.table_info(TABLE)
    result = verify_table(conn, info, info.primary_key, str(work / "lake" / "shop" / "orders"))
    print(result.summary(), flush=True)
    return bool(result.equal)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=None, help="default: 0.25%% of --rows")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="repetitions of the snapshot and of the binlog apply (medians)",
    )
    parser.add_argument(
        "--dump-partitions",
        type=int,
        action="append",
        default=[],
        help="numPartitions of the plain dump (repeatable: the fastest counts); default 8",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--chunk-size", type=int, default=None, help="default: Tidemark's default")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument(
        "--binlog-rows",
        type=int,
        default=1_000_000,
        help="rows updated at the end, applied by a run and decoded by mariadb-binlog (0: skip)",
    )
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 50,000 rows, one repetition"
    )
    parser.add_argument("--logs", type=Path, help="save each run's log here")
    args = parser.parse_args()
    global LOGS
    LOGS = args.logs
    rows = 50_000 if args.quick else args.rows
    changes = args.changes or max(1, rows // 400)
    partitions = args.dump_partitions or [8]

    with scratch_server("tidemark-bench-dump-") as (work, server):
        conn = load_sample_shop(server, rows)
        bounds = key_bounds(conn)
        config = pipeline(work, server, args.master, args.driver_memory, args.chunk_size)
        scans, dumps, snaps = [], [], []
        for repetition in range(args.repeat):
            scans.append((timed_scan(server), load()))
            for n in partitions:
                dumps.append(
                    (
                        n,
                        plain_dump(
                            server, work / "dump", n, args.master, args.driver_memory, bounds
                        ),
                        load(),
                    )
                )
            config_path = fresh_config(work / "run", config)
            snaps.append((tidemark(config_path, f"snapshot-{repetition + 1}"), load()))
            print(
                f"repetition {repetition + 1}: scan {scans[-1][0]:.2f}s, dump "
                + ", ".join(
                    f"{n} partitions {t.seconds:.2f}s" for n, t, _ in dumps[-len(partitions) :]
                )
                + f", tidemark {snaps[-1][0].seconds:.2f}s (load {load()})",
                flush=True,
            )
        conn.select_db("shop")
        warm = WarmRuns(work / "warm", config)
        increments = []
        for n, pattern in enumerate(("uniform", "recent")):
            # the second batch of inserts goes above the first's, between keys at another offset
            done = apply_changes(
                conn,
                rows,
                pattern,
                changes,
                seed=7 + n,
                top=10 * rows + 10 * n * changes,
                between=3 + 4 * n,
            )
            increments.append(
                (pattern, sum(done.values()), tidemark(config_path, pattern), warm.run(), load())
            )
        warm.close()
        equal = (
            True if args.no_verify else verify(config_path, conn, work / "warm")
        )  # before the next changes
        binlogs = [
            apply_updates(server, conn, config_path, min(rows, args.binlog_rows))
            for _ in range(args.repeat if args.binlog_rows else 0)
        ]
        equal = (True if args.no_verify else verify(config_path, conn, work / "run")) and equal
        conn.close()
        report(rows, scans, dumps, snaps, increments, args.master)
        if not binlogs:
            return 0 if equal else 1
        decode = statistics.median(d for _, d, _, _ in binlogs)
        run = statistics.median(r.seconds for _, _, r, _ in binlogs)
        each = ", ".join(f"{d / r.seconds:.2f}x" for _, d, r, _ in binlogs)
        loads = sorted((ld for _, _, _, ld in binlogs), key=float)
        print(
            f"  {binlogs[0][0]:,} updated rows: mariadb-binlog -vv {decode:.2f}s, "
            f"tidemark run {run:.2f}s: ratio {decode / run:.2f}x  (medians of {len(binlogs)}; "
            f"per repetition {each}; load {loads[0]}-{loads[-1]})"
        )
        return 0 if equal else 1


def report(
    rows: int,
    scans: list[tuple[float, str]],
    dumps: list[tuple[int, Timing, str]],
    snaps: list[tuple[Timing, str]],
    increments: list[tuple[str, int, Timing, float, str]],
    master: str,
) -> None:
    med = statistics.median
    scan = med(s for s, _ in scans)
    by_n: dict[int, list[float]] = {}
    for n, t, _ in dumps:
        by_n.setdefault(n, []).append(t.seconds)
    best_n = min(by_n, key=lambda n: med(by_n[n]))
    dump = med(by_n[best_n])
    snap = med(t.seconds for t, _ in snaps)
    loads = sorted({ld for _, ld in scans} | {ld for _, _, ld in dumps} | {ld for _, ld in snaps})
    print(
        f"\n{rows:,} rows of {TABLE}, master {master}, {os.cpu_count()} cores (shared); medians of "
        f"{len(snaps)}; load average during the runs {loads[0]}-{loads[-1]}"
    )
    print(f"  mariadb --quick scan                 {scan:8.2f}s")
    for n, times in sorted(by_n.items()):
        print(f"  plain Spark JDBC dump, {n:>3} parts     {med(times):8.2f}s")
    peak = med(t.peak_rss for t, _ in snaps) / 2**20
    print(
        f"  tidemark run (snapshot)              {snap:8.2f}s   "
        f"ratio vs the dump {dump / snap:5.2f}x"
        f"   (peak RSS {peak:,.0f} MiB)"
    )
    for pattern, n, timing, warm, ld in increments:
        print(
            f"  tidemark run after {n:,} {pattern} changes {timing.seconds:8.2f}s   "
            "ratio to the snapshot "
            f"{timing.seconds / snap:5.3f}   (load {ld})"
        )
        print(
            f"    the same in a process that ran before (run --every) {warm:8.2f}s   "
            "ratio to the snapshot "
            f"{warm / snap:5.3f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
