r"""The lake on S3 vs on local disk, side by side: a snapshot of ``shop.orders`` and an
incremental run after 0.25% of the rows changed, and the S3 requests each run made.

Two pipelines read the same private MariaDB: one with staging and lake on local disk, one with
both on an S3 endpoint (moto's server, tests/services.py, on this machine: what is measured is
Tidemark's requests and copies, not a network). Each repetition snapshots both (local first in
odd repetitions, S3 first in even ones), applies the same changes, and runs both incrementally;
the medians are printed. S3
requests are counted from the server's request log (one line per HTTP request), by method,
and divided by the versions the run published.

    .venv/bin/python bench/bench_s3.py --rows 1000000 --repeat 2
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_incremental import apply_changes  # noqa: E402
from bench.shop_lake import load_sample_shop, scratch_server, write_pipeline  # noqa: E402
from tests.services import S3_ACCESS_KEY, S3_SECRET_KEY, MotoS3  # noqa: E402

KEY_ENV, SECRET_ENV = "BENCH_S3_KEY", "BENCH_S3_SECRET"
#: A request's line in the server's log; werkzeug colours some by status (a 206 partial GET,
#: a 404), with ANSI codes between the quote and the method.
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|POST|HEAD|DELETE) ')


def requests(log: Path, since: int) -> tuple[collections.Counter[str], int]:
    """Requests by method in the server's log after byte ``since``; the log's new end."""
    data = log.read_bytes()
    return collections.Counter(_REQUEST.findall(data[since:].decode(errors="replace"))), len(data)


def run(config: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"tidemark run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def s3_config(work: Path, name: str, config: dict[str, Any], endpoint: str, bucket: str) -> Path:
    """``config`` with staging and lake in ``bucket`` at ``endpoint`` (the keys in `KEY_ENV` and
    `SECRET_ENV`) and its state in ``work``, written as ``work/<name>.yaml``."""
    config = {
        **config,
        "state": {"url": f"sqlite:///{work / f'{name}-state.db'}"},
        "output": {
            "path": f"s3://{bucket}/lake",
            "staging": f"s3a://{bucket}/staging",
            "s3": {
                "endpoint": endpoint,
                "path_style": True,
                "access_key_env": KEY_ENV,
                "secret_key_env": SECRET_ENV,
            },
        },
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def s3_pipeline(local: Path, work: Path, s3: MotoS3, bucket: str) -> Path:
    """The local pipeline's config with staging and lake in ``bucket``."""
    config: dict[str, Any] = yaml.safe_load(local.read_text())
    return s3_config(work, "bench-s3", {**config, "pipeline": "bench_s3"}, s3.endpoint, bucket)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--changes", type=float, default=0.0025, help="fraction of rows changed")
    args = parser.parse_args()
    os.environ[KEY_ENV], os.environ[SECRET_ENV] = S3_ACCESS_KEY, S3_SECRET_KEY
    times: dict[str, list[float]] = collections.defaultdict(list)
    counted: dict[str, list[collections.Counter[str]]] = collections.defaultdict(list)
    s3 = MotoS3.start()
    log = s3.root / "moto.log"
    try:
        for rep in range(args.repeat):
            with scratch_server("tidemark-bench-s3-") as (work, server):
                conn = load_sample_shop(server, args.rows)
                local = write_pipeline(
                    work, server, name="bench_local", master="local[2]", defaults={}
                )
                bucket = s3.create_bucket(f"bench-{rep}-{os.getpid()}")
                remote = s3_pipeline(local, work, s3, bucket)
                for kind in ("snapshot", "incremental"):
                    if kind == "incremental":
                        apply_changes(conn, args.rows, "uniform", int(args.rows * args.changes))
                    # the first run after the load or the changes warms the server's cache: the
                    # two go first in turn
                    for where in ("local", "s3") if rep % 2 == 0 else ("s3", "local"):
                        if where == "local":
                            times[f"{kind} local"].append(run(local))
                            continue
                        _, mark = requests(log, 0)
                        times[f"{kind} s3"].append(run(remote))
                        by_method, _ = requests(log, mark)
                        counted[kind].append(by_method)
                    print(
                        f"rep {rep + 1} {kind}: local {times[f'{kind} local'][-1]:.1f}s, "
                        f"S3 {times[f'{kind} s3'][-1]:.1f}s, S3 requests {dict(by_method)}",
                        flush=True,
                    )
                conn.close()
    finally:
        s3.stop()
    load = os.getloadavg()
    print(f"\n{args.rows:,} rows, medians of {args.repeat}; load {load[0]:.1f} {load[1]:.1f}")
    for kind in ("snapshot", "incremental"):
        local_s = statistics.median(times[f"{kind} local"])
        s3_s = statistics.median(times[f"{kind} s3"])
        total = statistics.median(sum(c.values()) for c in counted[kind])
        methods = sorted({m for c in counted[kind] for m in c})
        split = ", ".join(
            f"{m} {statistics.median(c[m] for c in counted[kind]):.0f}" for m in methods
        )
        print(
            f"{kind}: local {local_s:.1f}s, S3 {s3_s:.1f}s ({s3_s / local_s:.2f}x); "
            f"S3 requests per published version {total:.0f} ({split})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
