r"""Many small tables on S3 with a network's round trip: a run with no change and a run after
one row of every table changed, their time and S3 requests.

moto's server (tests/services.py) answers on this machine in well under a millisecond; a store
across a network takes a round trip per request. The S3 endpoint the pipelines get is a proxy in
front of moto that holds each request ``--latency-ms`` before passing it on (the first bytes a
client sends after the last answer on its connection: one wait a request, whatever its size).
One private MariaDB holds ``--tables`` tables of 100 rows (`bench.bench_tables`, ``many.*``);
each checkout gets its own bucket and state, snapshots the tables once, then each repetition
runs it with no change and again after one row of every table changed (checkouts in turn,
the order alternating). Medians are printed, with the requests of each run.

    .venv/bin/python bench/bench_s3_tables.py --tables 200 --latency-ms 10 --repeat 3
    .venv/bin/python bench/bench_s3_tables.py --compare-with /tmp/tidemark-main
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_s3 import KEY_ENV, SECRET_ENV, requests, s3_config  # noqa: E402
from bench.bench_snapshot import run_env, step_times  # noqa: E402
from bench.bench_tables import change_each, load, pipeline  # noqa: E402
from bench.shop_lake import scratch_server  # noqa: E402
from tests.services import S3_ACCESS_KEY, S3_SECRET_KEY, MotoS3  # noqa: E402


class Delayed:
    """A TCP proxy on a free local port to ``port``: the first bytes a client sends after the
    server's last answer on that connection (a new request) wait ``seconds`` first."""

    def __init__(self, port: int, seconds: float) -> None:
        self.target, self.seconds = port, seconds
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.target))
            answered = threading.Event()
            answered.set()
            threading.Thread(
                target=self._pass, args=(client, server, answered, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pass, args=(server, client, answered, False), daemon=True
            ).start()

    def _pass(
        self, src: socket.socket, dst: socket.socket, answered: threading.Event, ask: bool
    ) -> None:
        try:
            while data := src.recv(1 << 16):
                if ask and answered.is_set():
                    answered.clear()
                    time.sleep(self.seconds)
                elif not ask:
                    answered.set()
                dst.sendall(data)
        except OSError:  # either end closed
            pass
        finally:
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


def timed(code: Path, config: Path) -> tuple[float, dict[str, float]]:
    """A ``tidemark run`` of the checkout at ``code``: its seconds, and each step's."""
    start, started = time.perf_counter(), time.time()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
        cwd=code,
        env=run_env(code),
    )
    if done.returncode != 0:
        raise SystemExit(f"tidemark run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start, step_times(done.stdout + done.stderr, started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare-with", type=Path, help="another checkout, timed alongside")
    args = parser.parse_args()
    os.environ[KEY_ENV], os.environ[SECRET_ENV] = S3_ACCESS_KEY, S3_SECRET_KEY
    codes = {"this": ROOT}
    if args.compare_with:
        codes[args.compare_with.name] = args.compare_with.resolve()
    times: dict[str, list[float]] = collections.defaultdict(list)
    counted: dict[str, list[int]] = collections.defaultdict(list)
    s3 = MotoS3.start()
    log = s3.root / "moto.log"
    try:
        proxy = Delayed(s3.port, args.latency_ms / 1000)
        endpoint = f"http://127.0.0.1:{proxy.port}"
        with scratch_server("tidemark-bench-s3-tables-") as (work, server):
            load(server, args.tables, 100)
            base = pipeline(server, "many", "many.*", "local[2]")
            configs = {
                name: s3_config(
                    work, name, base, endpoint, s3.create_bucket(f"b-{i}-{os.getpid()}")
                )
                for i, name in enumerate(codes)
            }
            for name, code in codes.items():
                print(f"{name}: snapshot {timed(code, configs[name])[0]:.1f}s", flush=True)
            for rep in range(args.repeat):
                for kind in ("no change", "changed"):
                    if kind == "changed":
                        change_each(server, args.tables, 100, rep)
                    order = list(codes) if rep % 2 == 0 else list(reversed(codes))
                    for name in order:
                        _, mark = requests(log, 0)
                        seconds, steps = timed(codes[name], configs[name])
                        times[f"{name} {kind}"].append(seconds)
                        by_method, _ = requests(log, mark)
                        counted[f"{name} {kind}"].append(sum(by_method.values()))
                        print(
                            f"rep {rep + 1} {name} {kind}: {seconds:.1f}s, "
                            f"{counted[f'{name} {kind}'][-1]} requests; "
                            + ", ".join(f"{step} {s:.1f}s" for step, s in steps.items()),
                            flush=True,
                        )
    finally:
        s3.stop()
    load_avg = os.getloadavg()
    print(
        f"\n{args.tables} tables, {args.latency_ms:g} ms a request, medians of {args.repeat}; "
        f"load {load_avg[0]:.1f} {load_avg[1]:.1f}"
    )
    for kind in ("no change", "changed"):
        for name in codes:
            key = f"{name} {kind}"
            print(
                f"{kind}, {name}: {statistics.median(times[key]):.1f}s, "
                f"{statistics.median(counted[key]):.0f} requests "
                f"({statistics.median(counted[key]) / args.tables:.1f} a table)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
