r"""Tidemark vs Debezium, side by side on one table: a snapshot and a catch-up.

Debezium (3.6.1.Final, its MySQL connector in the embedded engine, `bench/debezium/`) writes
every change event's JSON value to a file, a line each: the cheapest sink it has. This script
runs, on the same private MariaDB and ``shop.orders``, each in a process of its own (a JVM, as a
user runs either):

1. Debezium's **incremental snapshot** (the DBLog algorithm Flink CDC builds on): the engine
   starts with ``snapshot.mode=no_data`` and, once its first event is out, the script's runner
   inserts an ``execute-snapshot`` row into the signal table ``shop.debezium_signal``. That is
   Debezium's way: the signal and the chunk watermarks are writes to the source. The run ends
   when every row of the table has come out as a ``read`` event;
2. Debezium's **initial snapshot** (``snapshot.mode=initial``: one ``SELECT *`` under a brief
   global read lock), ending the same way; its offsets are kept for 4;
3. ``tidemark run``: a snapshot into a fresh lake (published Iceberg table);

then, ``--catchup-repeat`` times, ``--changes`` changes spread over every key
(`bench_incremental.apply_changes`, pattern ``uniform``) followed by a row in
``shop.bench_marker``, and

4. Debezium's engine again from the initial snapshot's offsets, until the marker's event is out;
5. ``tidemark run`` on the lake of 3.

Every timed run starts on a freshly restarted server (cold buffer pool, warm page cache), the
same for both. Debezium 3.6's MySQL connector reads ``VERSION()`` and takes MariaDB 10.11 for a
MySQL 8.4 or later (it then asks ``SHOW BINARY LOG STATUS``, which MariaDB lacks), and its
MariaDB connector is not served here: for Debezium's runs the server starts with ``--version``
reporting ``8.0.99-<the real version>``, and Debezium connects through MariaDB Connector/J (the
jar Tidemark uses; MySQL Connector/J 9 asks MariaDB for ``transaction_isolation``, which 10.11
does not have). Tidemark's runs use the real version. Both JVMs get a 2 GiB heap.

The published table is verified against the source at the end (``--no-verify`` skips it).

    .venv/bin/python bench/bench_vs_debezium.py --rows 1000000 --repeat 3
    .venv/bin/python bench/bench_vs_debezium.py --rows 4000000 --changes 100000 --repeat 3
    .venv/bin/python bench/bench_vs_debezium.py --quick        # smoke run: 20k rows
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.bench_vs_dump as dump  # noqa: E402
from bench.bench_incremental import apply_changes  # noqa: E402
from bench.bench_snapshot import Timing, TreeSampler, fresh_config  # noqa: E402
from bench.shop_lake import load_sample_shop, scratch_server  # noqa: E402
from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB  # noqa: E402
from orchestrator.app.demo.sample import connect  # noqa: E402

DEBEZIUM = ROOT / "bench" / "debezium"
MARIADB_JAR = "/usr/share/java/mariadb-java-client.jar"
TOPIC = "bench.shop.orders"
MARKER_TOPIC = "bench.shop.bench_marker"

_TABLES = (
    "CREATE TABLE shop.debezium_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL,"
    " data VARCHAR(2048) NULL)",
    "CREATE TABLE shop.bench_marker (id INT AUTO_INCREMENT PRIMARY KEY, at DATETIME(6))",
)


def prepare() -> str:
    """The runner's classpath; `bench/debezium/setup.sh` first when its jars or classes are
    missing."""
    if (
        not (DEBEZIUM / "lib" / ".complete").exists()
        or not (DEBEZIUM / "classes" / "Runner.class").exists()
    ):
        subprocess.run(["bash", str(DEBEZIUM / "setup.sh")], check=True)
    return f"{MARIADB_JAR}:{DEBEZIUM / 'lib'}/*:{DEBEZIUM / 'classes'}"


@dataclass
class Server:
    """The bench's MariaDB, restarted before each timed run: as itself for Tidemark, reporting
    an 8.0 version for Debezium (the module docstring says why)."""

    db: LocalMariaDB
    real: str

    def as_itself(self) -> None:
        self.db.restart(dict(GOOD_BINLOG))

    def for_debezium(self) -> None:
        self.db.restart({**GOOD_BINLOG, "version": f"8.0.99-{self.real}"})


def properties(server: LocalMariaDB, state: Path, mode: str, chunk_size: int) -> Path:
    """A Debezium engine config keeping its offsets and schema history under ``state``."""
    state.mkdir(parents=True, exist_ok=True)
    props = {
        "name": "bench",
        "connector.class": "io.debezium.connector.mysql.MySqlConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(state / "offsets.dat"),
        "offset.flush.interval.ms": "10000",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(state / "history.dat"),
        "database.hostname": "127.0.0.1",
        "database.port": str(server.port),
        "database.user": "root",
        "database.password": "",
        "database.server.id": "54099",
        "database.jdbc.driver": "org.mariadb.jdbc.Driver",
        "database.protocol": "jdbc:mariadb",
        "topic.prefix": "bench",
        "database.include.list": "shop",
        "table.include.list": "shop.orders,shop.bench_marker,shop.debezium_signal",
        "signal.data.collection": "shop.debezium_signal",
        "snapshot.mode": mode,
        "incremental.snapshot.chunk.size": str(chunk_size),
        "tombstones.on.delete": "false",
        "converter.schemas.enable": "false",
    }
    path = state / "engine.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def debezium(
    classpath: str, props: Path, out: Path, topic: str, count: int, signal: str | None = None
) -> tuple[Timing, dict[str, float], int]:
    """One run of the embedded engine until ``count`` events of ``topic``: its wall time (the
    process: JVM start to exit), the runner's own figures and the sink file's size."""
    port = next(
        line.split("=", 1)[1]
        for line in props.read_text().splitlines()
        if line.startswith("database.port=")
    )
    cmd = ["java", "-Xmx2g", "-cp", classpath, "Runner", "--props", str(props), "--out", str(out)]
    cmd += ["--topic", topic, "--count", str(count), "--timeout", "7200"]
    if signal is not None:
        cmd += ["--signal", signal, "--jdbc-url", f"jdbc:mariadb://127.0.0.1:{port}/"]
        cmd += ["--user", "root"]
    started = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(child.pid)
    try:
        stdout, stderr = child.communicate()
    finally:
        timing = sampler.close(Timing(time.perf_counter() - started))
    if dump.LOGS is not None:
        dump.LOGS.mkdir(parents=True, exist_ok=True)
        (dump.LOGS / f"debezium-{out.stem}.log").write_text(stderr)
    if child.returncode != 0:
        raise SystemExit(f"debezium failed with {child.returncode}:\n{stderr[-3000:]}")
    words = stdout.split()
    figures = {words[i]: float(words[i + 1]) for i in range(0, len(words) - 1, 2)}
    size = out.stat().st_size
    out.unlink()
    return timing, figures, size


def marker(port: int) -> None:
    conn = connect("127.0.0.1", port, "root", "", None)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO shop.bench_marker (at) VALUES (NOW(6))")
    conn.commit()
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="snapshot repetitions (medians)")
    parser.add_argument("--catchup-repeat", type=int, default=None, help="default: --repeat")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--debezium-chunk-size",
        type=int,
        default=1024,
        help="incremental.snapshot.chunk.size (Debezium's default 1024)",
    )
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 rows, once")
    parser.add_argument("--logs", type=Path, help="save each run's log here")
    args = parser.parse_args()
    dump.LOGS = args.logs
    rows, changes, repeat = args.rows, args.changes, args.repeat
    if args.quick:
        rows, changes, repeat = 20_000, 1_000, 1
    catchups = args.catchup_repeat or repeat
    classpath = prepare()

    with scratch_server("tidemark-bench-dbz-") as (work, db):
        conn = load_sample_shop(db, rows)
        with conn.cursor() as cur:
            for sql in _TABLES:
                cur.execute(sql)
            cur.execute("SELECT COUNT(*) FROM shop.orders")
            count = int(cur.fetchone()[0])
            cur.execute("SELECT VERSION()")
            server = Server(db, str(cur.fetchone()[0]))
        conn.close()
        config = dump.pipeline(work, db, args.master, "2g", None)
        snaps: dict[str, list[tuple[Timing, str]]] = {"incremental": [], "initial": []}
        snaps["tidemark"] = []
        sizes: dict[str, int] = {}
        for rep in range(repeat):
            for mode in ("incremental", "initial"):
                server.for_debezium()
                state = work / f"debezium-{mode}-{rep}"
                signal = (
                    "INSERT INTO shop.debezium_signal VALUES "
                    f"('snapshot-{rep}', 'execute-snapshot', "
                    '\'{"data-collections": ["shop.orders"], "type": "incremental"}\')'
                    if mode == "incremental"
                    else None
                )
                props = properties(
                    db,
                    state,
                    "no_data" if mode == "incremental" else "initial",
                    args.debezium_chunk_size,
                )
                timing, figures, sizes[mode] = debezium(
                    classpath, props, work / f"{mode}-{rep}.json", TOPIC, count, signal
                )
                snaps[mode].append((timing, dump.load()))
                print(
                    f"repetition {rep + 1}: debezium {mode} snapshot {timing.seconds:.2f}s "
                    f"(first event at {figures['first_event_s']:.1f}s; load {dump.load()})",
                    flush=True,
                )
            server.as_itself()
            config_path = fresh_config(work / "run", config)
            snaps["tidemark"].append((dump.tidemark(config_path, f"snapshot-{rep}"), dump.load()))
            print(
                f"repetition {rep + 1}: tidemark snapshot {snaps['tidemark'][-1][0].seconds:.2f}s"
                f" (load {dump.load()})",
                flush=True,
            )
        catch: list[tuple[int, Timing, Timing, str]] = []
        initial = properties(db, work / f"debezium-initial-{repeat - 1}", "initial", 1024)
        for n in range(catchups):
            server.as_itself()
            conn = connect("127.0.0.1", db.port, "root", "", "shop")
            done = apply_changes(
                conn,
                rows,
                "uniform",
                changes,
                seed=11 + n,
                top=10 * rows + 10 * n * changes,
                between=(1, 3, 7, 9)[n % 4],
            )
            conn.commit()
            conn.close()
            marker(db.port)
            server.as_itself()
            ours = dump.tidemark(config_path, f"catchup-{n}")
            server.for_debezium()
            theirs, _, _ = debezium(classpath, initial, work / f"catchup-{n}.json", MARKER_TOPIC, 1)
            catch.append((sum(done.values()), ours, theirs, dump.load()))
            print(
                f"catch-up {n + 1}: {catch[-1][0]:,} changes: tidemark {ours.seconds:.2f}s, "
                f"debezium {theirs.seconds:.2f}s (load {dump.load()})",
                flush=True,
            )
        server.as_itself()
        equal = True
        if not args.no_verify:
            conn = connect("127.0.0.1", db.port, "root", "", "shop")
            equal = dump.verify(config_path, conn, work / "run")
            conn.close()
        report(count, snaps, sizes, catch)
        return 0 if equal else 1


def report(
    rows: int,
    snaps: dict[str, list[tuple[Timing, str]]],
    sizes: dict[str, int],
    catch: list[tuple[int, Timing, Timing, str]],
) -> None:
    med = statistics.median
    loads = sorted({ld for runs in snaps.values() for _, ld in runs} | {c[3] for c in catch})
    times = {name: med(t.seconds for t, _ in runs) for name, runs in snaps.items()}
    print(
        f"\n{rows:,} rows of shop.orders; medians of {len(snaps['tidemark'])} (catch-ups: "
        f"{len(catch)}); load average {loads[0]}-{loads[-1]}"
    )
    for name, label in (
        ("tidemark", "tidemark run (snapshot, published)"),
        ("incremental", "debezium incremental snapshot"),
        ("initial", "debezium initial snapshot"),
    ):
        seconds = times[name]
        extra = "" if name == "tidemark" else f"  {seconds / times['tidemark']:5.2f}x Tidemark's"
        peak = med(t.peak_rss for t, _ in snaps[name]) / 2**20
        print(
            f"  {label:<36} {seconds:8.2f}s {rows / seconds:>10,.0f} rows/s"
            f"  peak RSS {peak:,.0f} MiB{extra}"
        )
    for name in ("incremental", "initial"):
        print(f"    the {name} snapshot's output: {sizes[name] / 2**20:,.0f} MiB of JSON events")
    if catch:
        ours = med(c[1].seconds for c in catch)
        theirs = med(c[2].seconds for c in catch)
        print(
            f"  catch-up after {catch[0][0]:,} changes: tidemark run {ours:.2f}s, debezium "
            f"{theirs:.2f}s: Tidemark {theirs / ours:.2f}x Debezium's speed"
        )


if __name__ == "__main__":
    raise SystemExit(main())
