r"""Snapshot throughput: `tidemark run` end to end vs a raw `mariadb --quick` scan, side by side.

Both read the same 10-column table (``shop.orders``) in the same private
MariaDB on this machine; the ratio (Tidemark rows/s ÷ client rows/s) is the
figure the README reports. Each repetition runs the scan and a fresh snapshot
(new state and output) one after the other, and the medians are printed, with
the run split into its steps (from the CLI's log lines) so the figure says
where the time goes. ``--compare-with DIR`` also times another checkout of
Tidemark (say ``git archive HEAD | tar -x -C DIR``) in the same repetitions,
on the same data, the order alternating: a baseline measured side by side.
``--compare-factor HIGH`` times, the same way, this checkout with
``defaults.even_distribution_factor: [0.05, HIGH]``: what the plan's index walk
costs a table whose key is sparse (the sample shop's ids are 10, 20, 30, ...: a
distribution factor of 10, above the default bound of 2, docs/chunking.md).

    .venv/bin/python bench/bench_snapshot.py --rows 1000000 --repeat 3
    .venv/bin/python bench/bench_snapshot.py --rows 1000000 --repeat 3 \
        --compare-with /tmp/tidemark-head
    .venv/bin/python bench/bench_snapshot.py --rows 4000000 --repeat 3 --compare-factor 100
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import load_sample_shop, scratch_server  # noqa: E402
from orchestrator.app.demo.localdb import LocalMariaDB  # noqa: E402

TABLE = "shop.orders"

#: Log lines that end a step of `tidemark run`, in order: (step, pattern); the last match counts.
#: A line many tables share names how many (`orchestrator.pipeline.lines`).
_TABLES = r"(table \S+|\d+ tables)"
STEP_ENDS = (
    ("start+plan", re.compile(rf"orchestrator\.[\w.]+: {_TABLES}: (snapshot, |incremental from )")),
    ("spark start", re.compile(r"orchestrator\.[\w.]+: spark session ")),
    ("read", re.compile(r"orchestrator\.[\w.]+: batch \d+ ")),
    ("capture", re.compile(r"orchestrator\.[\w.]+: capture: ")),
    ("reconcile", re.compile(rf"orchestrator\.[\w.]+: {_TABLES}: reconciled")),
    ("publish", re.compile(rf"orchestrator\.[\w.]+: {_TABLES}: (published|no change)")),
)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class Timing:
    """One `tidemark run`: wall seconds, seconds per step (the rest is process exit), CPU,
    memory."""

    seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    cpu: float = 0.0  # CPU seconds of the run's process tree (not of the MariaDB server)
    peak_rss: int = 0  # bytes, the whole tree at one instant
    peak_jvm: int = 0
    peak_python: int = 0


def _forked_jvm(member: psutil.Process, jvms: set[int]) -> bool:
    """Whether ``member`` is a JVM's child not yet ``exec``-ed into its command (Hadoop runs
    ``chmod`` and the like by forking): its resident pages are the JVM's, shared, not its own."""
    try:
        return member.ppid() in jvms and member.exe().endswith("/java")
    except psutil.Error:
        return False


class TreeSampler:
    """Samples a process and its descendants every ``every`` seconds, from a thread, until closed.

    Records the peak resident memory (summed over the tree at one instant, and its
    JVM and Python parts) and the CPU seconds each process had used when last seen.
    """

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.root = psutil.Process(pid)
        self.every = every
        self.cpu: dict[int, float] = {}
        self.peak_rss = self.peak_jvm = self.peak_python = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        try:
            members = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        jvm = python = 0
        jvms: set[int] = set()
        for member in members:
            if _forked_jvm(member, jvms):
                continue
            try:
                with member.oneshot():
                    rss, name, times = member.memory_info().rss, member.name(), member.cpu_times()
            except psutil.NoSuchProcess:
                continue
            self.cpu[member.pid] = times.user + times.system
            if name == "java":
                jvms.add(member.pid)
                jvm += rss
            else:
                python += rss
        self.peak_rss = max(self.peak_rss, jvm + python)
        self.peak_jvm = max(self.peak_jvm, jvm)
        self.peak_python = max(self.peak_python, python)

    def close(self, timing: Timing) -> Timing:
        """Stop sampling and put the figures into ``timing``."""
        self._stop.set()
        self._thread.join()
        timing.cpu = sum(self.cpu.values())
        timing.peak_rss, timing.peak_jvm, timing.peak_python = (
            self.peak_rss,
            self.peak_jvm,
            self.peak_python,
        )
        return timing


def pipeline(
    work: Path,
    server: LocalMariaDB,
    *,
    master: str,
    chunk_size: int | None,
    batch_chunks: int | None,
    conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pipeline config snapshotting `TABLE` into ``work``; Tidemark's defaults unless given."""
    defaults = {k: v for k, v in (("chunk_size", chunk_size), ("batch_chunks", batch_chunks)) if v}
    config: dict[str, Any] = {
        "pipeline": "bench",
        "source": server.source_config(),
        "spark": {"master": master, "conf": {"spark.ui.enabled": "false", **(conf or {})}},
        "output": {"path": str(work / "lake")},
        "state": {"url": f"sqlite:///{work / 'state.db'}"},
        "tables": [{"name": TABLE}],
    }
    if defaults:
        config["defaults"] = defaults
    return config


def discard(path: Path) -> None:
    """Put ``path`` out of the way without deleting it: it is moved under its parent's
    ``.discarded/`` (same filesystem: a rename), which goes when the benchmark's work dir does.

    A run timed right after thousands of files were deleted is not the run a user makes: on an
    ext4 without a journal (this machine's root filesystem) every new inode is allocated past
    the inodes freed in the last 60-300 s, each checked in the inode table (`recently_deleted`
    in the kernel's ialloc.c). Deleting a 200-table lake before the next repetition's run made
    that run's file and directory creations a quarter of its CPU (perf: `find_inode_bit`,
    `recently_deleted`), and its children's system time 2.0-3.2 s instead of 0.7-0.9 s."""
    if not path.exists():
        return
    aside = path.parent / ".discarded"
    aside.mkdir(exist_ok=True)
    path.rename(aside / f"{path.name}-{uuid.uuid4().hex[:8]}")


def fresh_config(work: Path, config: dict[str, Any]) -> Path:
    """``work`` emptied and holding ``config`` as ``bench.yaml``: the next run starts from
    nothing (the previous content is `discard`-ed, not deleted)."""
    discard(work)
    work.mkdir(parents=True)
    config = {
        **config,
        "output": {"path": str(work / "lake")},
        "state": {"url": f"sqlite:///{work / 'state.db'}"},
    }
    path = work / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


_COMPILED: set[Path] = set()


def compiled(code: Path) -> None:
    """The checkout's packages compiled to ``__pycache__`` (once per benchmark), as an installed
    package is: a run then loads its modules' bytecode instead of compiling about 100 source
    files at each start (0.2 s here, where ``PYTHONDONTWRITEBYTECODE=1`` is set machine-wide, so
    no run would ever write the cache itself)."""
    if code in _COMPILED:
        return
    for package in ("orchestrator", "chunking"):
        if (code / package).is_dir():
            compileall.compile_dir(str(code / package), quiet=1)
    _COMPILED.add(code)


def run_command(config_path: Path) -> list[str]:
    """``tidemark run``, as a user runs it (the checkout is the working directory)."""
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--config",
        str(config_path),
        "--no-progress",
    ]


def run_env(code: Path) -> dict[str, str]:
    """The environment of a run of the checkout at ``code`` (it comes first on the path), whose
    modules are compiled to bytecode first (`compiled`)."""
    compiled(code)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
    return env


def step_times(log: str, started: float) -> dict[str, float]:
    """Seconds per step from the CLI's log lines (``asctime`` is local time, ms resolution)."""
    ends: dict[str, float] = {}
    for line in log.splitlines():
        stamp = _STAMP.match(line)
        if not stamp:
            continue
        for step, pattern in STEP_ENDS:
            if pattern.search(line):
                ends[step] = dt.datetime.strptime(
                    stamp.group(1), "%Y-%m-%d %H:%M:%S,%f"
                ).timestamp()
    steps, previous = {}, started
    for step, _ in STEP_ENDS:
        if step in ends:
            steps[step] = max(0.0, ends[step] - previous)
            previous = ends[step]
    return steps


def timed_run(code: Path, config_path: Path) -> Timing:
    """One `tidemark run` of the checkout at ``code``, timed and sampled; exits when it fails."""
    started_wall = time.time()
    start = time.perf_counter()
    child = subprocess.Popen(
        run_command(config_path),
        env=run_env(code),
        cwd=code,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = TreeSampler(child.pid)
    try:
        stdout, stderr = (
            child.communicate()
        )  # `run` logs its steps to stdout, its failure to stderr
    finally:
        seconds = time.perf_counter() - start
        timing = sampler.close(Timing(seconds))
    if child.returncode != 0:
        raise SystemExit(f"tidemark run ({code}) failed with {child.returncode}:\n{stderr[-3000:]}")
    timing.steps = step_times(stdout + stderr, started_wall)
    return timing


def timed_scan(server: LocalMariaDB) -> float:
    client = shutil.which("mariadb") or shutil.which("mysql") or "mariadb"
    cmd = [
        client,
        "--no-defaults",
        "--quick",
        "-h127.0.0.1",
        f"-P{server.port}",
        "-uroot",
        "-e",
        f"SELECT * FROM {TABLE}",
    ]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(rows: int, scans: list[float], runs: dict[str, list[Timing]]) -> None:
    scan = median(scans)
    scan_rate = rows / scan
    print(f"\nmedians of {len(scans)} side-by-side repetition(s), {rows:,} rows:")
    print(f"  {'raw scan (mariadb --quick)':<34} {scan:7.2f}s {scan_rate:12,.0f} rows/s")
    for label, timings in runs.items():
        seconds = median([t.seconds for t in timings])
        rate = rows / seconds
        print(
            f"  {'tidemark run ' + label:<34} {seconds:7.2f}s {rate:12,.0f} rows/s"
            f"   ratio {rate / scan_rate:5.2f}x   "
            f"(each: {', '.join(f'{t.seconds:.1f}' for t in timings)})"
        )
        cpu = median([t.cpu for t in timings])
        peak = median([t.peak_rss for t in timings]) / 2**20
        print(f"  {'':<34} CPU {cpu:.1f}s (Python + JVM), peak RSS {peak:,.0f} MiB")
        steps = [s for s, _ in STEP_ENDS if all(s in t.steps for t in timings)]
        parts = [f"{s} {median([t.steps[s] for t in timings]):.1f}" for s in steps]
        print(f"  {'':<34} steps (s): {', '.join(parts)}")
        if "read" in steps:
            # A checkout that does not log its session start counts it in the read step.
            what = "read step" if "spark start" in steps else "read step (with spark start)"
            read = median([t.steps["read"] for t in timings])
            print(
                f"  {'':<34} {what} {rows / read:12,.0f} rows/s   "
                f"ratio {rows / read / scan_rate:5.2f}x"
            )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=None, help="default: Tidemark's default")
    parser.add_argument(
        "--batch-chunks", type=int, default=None, help="default: Tidemark's default"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra spark.conf for both checkouts",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="side-by-side repetitions (medians are printed)"
    )
    parser.add_argument(
        "--compare-with",
        type=Path,
        default=None,
        metavar="DIR",
        help="another Tidemark checkout, timed in the same repetitions",
    )
    parser.add_argument(
        "--compare-factor",
        type=float,
        default=None,
        metavar="HIGH",
        help="also this checkout with defaults.even_distribution_factor [0.05, HIGH]",
    )
    args = parser.parse_args()
    conf = dict(item.split("=", 1) for item in args.conf)
    codes = {"(this checkout)": ROOT}
    if args.compare_with:
        codes[f"({args.compare_with})"] = args.compare_with.resolve()
    factor_label = f"(factor bound {args.compare_factor:g})" if args.compare_factor else None
    if factor_label:
        codes[factor_label] = ROOT

    with scratch_server("tidemark-bench-") as (work, server):
        load_sample_shop(server, args.rows).close()
        config = pipeline(
            work,
            server,
            master=args.master,
            chunk_size=args.chunk_size,
            batch_chunks=args.batch_chunks,
            conf=conf,
        )
        configs = {label: config for label in codes}
        if factor_label:
            bound = [0.05, args.compare_factor]
            defaults = {**config.get("defaults", {}), "even_distribution_factor": bound}
            configs[factor_label] = {**config, "defaults": defaults}
        scans: list[float] = []
        runs: dict[str, list[Timing]] = {label: [] for label in codes}
        for repetition in range(args.repeat):
            scans.append(timed_scan(server))
            labels = list(codes) if repetition % 2 == 0 else list(reversed(codes))
            for label in labels:
                timing = timed_run(codes[label], fresh_config(work / "run", configs[label]))
                runs[label].append(timing)
                print(
                    f"repetition {repetition + 1}: scan {scans[-1]:.2f}s, "
                    f"run {label} {timing.seconds:.2f}s (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        report(args.rows, scans, runs)
        print(
            f"(machine: {os.cpu_count()} cores, shared; master {args.master}, chunk size "
            f"{args.chunk_size or 'default'}, batch chunks {args.batch_chunks or 'default'})"
        )
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
