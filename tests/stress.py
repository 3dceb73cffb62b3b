"""A long random run of `tests.workload` on a private MariaDB, for finding what a fixed seed does
not: ``python -m tests.stress --seed 7 --rounds 30 [--kill] [--big-rows 80000] [--s3]``.

Each round writes a random number of changes, turns the XA transaction over, starts a writer
thread (six rounds in ten), runs ``tidemark run`` while it writes (in this process, or with
``--kill`` mostly as a child process killed at a random moment and resumed by the next run),
stops the writer, then runs again on the quiet source (up to three times: a table that failed on
its own is retried; a run killed after it recorded ``H`` is finished by the next run at that
``H``, under the writer's last writes, so one more run catches up) and compares every table of
the lake with the source. A round prints
``equal`` or the difference; on a difference, or a quiet run that still fails, the server and its
pipeline are kept (port and directory printed) until ``<work>/stop`` exists, for a look at them.
``--big-rows`` above 50,000 has ``big`` read by Spark. ``--s3`` puts staging and lake on an S3
endpoint (moto's server, tests/services.py; the state stays in SQLite). Nothing here runs in CI:
tests/integration/test_random_workload.py runs the same mix with fixed seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import PipelineConfig
from orchestrator.pipeline.context import open_store
from tests import workload
from tests.conftest import (
    S3_KEY_ENV,
    S3_SECRET_ENV,
    assert_lake_equals_source,
    load_pipeline,
    s3_output,
)
from tests.services import S3_ACCESS_KEY, S3_SECRET_KEY, MotoS3

DATABASE = "st"


def _run(config: PipelineConfig) -> str:
    """One run in this process: ``0`` or what it raised (its traceback printed)."""
    try:
        return str(run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False))
    except Exception as exc:
        traceback.print_exc()
        return type(exc).__name__


def _began_before(config: PipelineConfig, moment: dt.datetime) -> bool:
    """Whether the pipeline's last run began before ``moment``: a run the quiet run resumed,
    which publishes at the ``H`` it recorded under the writer."""
    store = open_store(config)
    try:
        last = store.runs(config.pipeline, limit=1)[0]
    finally:
        store.close()
    began = last.created_at
    return (began if began.tzinfo else began.replace(tzinfo=dt.UTC)) < moment


def _killed_run(config: PipelineConfig, rng: random.Random) -> str:
    """``tidemark run`` as a child process, killed after a random delay if still running."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--config",
            str(config.path),
            "--no-progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    delay = rng.uniform(0.3, 4.0)
    try:
        return f"exit {process.wait(timeout=delay)}"
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        return f"killed at {delay:.1f}s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--kill", action="store_true", help="kill most runs under the writer")
    parser.add_argument("--big-rows", type=int, default=5000)
    parser.add_argument("--s3", action="store_true", help="staging and lake on moto's S3")
    args = parser.parse_args()
    work = Path(f"/tmp/tidemark-stress-{args.seed}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    logging.basicConfig(level=logging.WARNING, filename=work / "log.txt")
    server = LocalMariaDB.create(None, base_dir=work)
    server.start()
    with contextlib.ExitStack() as stack:
        stack.callback(server.destroy)
        output: dict[str, object] = {}
        if args.s3:
            s3 = MotoS3.start()
            stack.callback(s3.stop)
            os.environ[S3_KEY_ENV], os.environ[S3_SECRET_ENV] = S3_ACCESS_KEY, S3_SECRET_KEY
            output = {"output": s3_output(s3, s3.create_bucket(f"stress-{args.seed}"))}
        workload.create(server, DATABASE, big_rows=args.big_rows)
        config = load_pipeline(
            work,
            server,
            workload.table_entries(DATABASE),
            name="stress",
            defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
            **output,
        )
        return _rounds(server, config, work, args)


def _rounds(
    server: LocalMariaDB, config: PipelineConfig, work: Path, args: argparse.Namespace
) -> int:
    rng = random.Random(args.seed)
    load = workload.Workload(args.seed, DATABASE)
    print("first run:", _run(config), flush=True)
    conn = load.connect(server)
    for round_ in range(args.rounds):
        started = time.monotonic()
        load.write(conn, rng.randrange(5, 60))
        load.turn_xa(server)
        writer = None
        if rng.random() < 0.6:
            writer = workload.Writer(server, DATABASE, args.seed * 1000 + round_)
            writer.start()
        killed = args.kill and rng.random() < 0.7
        first = _killed_run(config, rng) if killed else _run(config)
        if writer is not None:
            writer.stop()
        stopped = dt.datetime.now(dt.UTC)
        quiet = _run(config)
        for _ in range(2):  # a table that failed on its own is retried by the next run
            if quiet == "0" and not _began_before(config, stopped):
                break
            quiet = _run(config)
        try:
            assert_lake_equals_source(config, server, [f"{DATABASE}.{t}" for t in workload.TABLES])
            outcome = "equal"
        except AssertionError as exc:
            outcome = f"DIFFERENT: {exc}"
        took = time.monotonic() - started
        print(f"round {round_}: runs {first}, {quiet}: {outcome} ({took:.1f}s)", flush=True)
        if outcome != "equal" or quiet != "0":
            print(f"kept: server on port {server.port}, pipeline {config.path}; touch {work}/stop")
            while not (work / "stop").exists():
                time.sleep(2)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
