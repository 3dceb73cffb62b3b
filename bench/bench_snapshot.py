"""Snapshot throughput: `tidemark run` end to end vs a raw `mariadb --quick` scan, side by side.

Both read the same 10-column table in the same private MariaDB on this machine;
the ratio (Tidemark rows/s ÷ client rows/s) is the figure the README reports.

    .venv/bin/python bench/bench_snapshot.py --rows 1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import load_sample_shop, write_pipeline  # noqa: E402
from orchestrator.localdb import LocalMariaDB  # noqa: E402


def timed(cmd: list[str], **kwargs: object) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=100_000)
    parser.add_argument("--batch-chunks", type=int, default=16)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=1, help="scan repetitions (best is kept)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    server = LocalMariaDB.create(base_dir=work)
    server.start()
    try:
        load_sample_shop(server, args.rows).close()
        config_path = write_pipeline(work, server, name="bench", master=args.master,
                                     defaults={"chunk_size": args.chunk_size, "batch_chunks": args.batch_chunks})

        client = shutil.which("mariadb") or shutil.which("mysql") or "mariadb"
        scan_cmd = [client, "--no-defaults", "--quick", "-h127.0.0.1", f"-P{server.port}", "-uroot",
                    "-e", "SELECT * FROM shop.orders"]
        scan = min(timed(scan_cmd, stdout=subprocess.DEVNULL) for _ in range(args.repeat))
        env = dict(os.environ)
        run = timed([sys.executable, "-m", "orchestrator", "run", "--config", str(config_path),
                     "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        scan_rate, run_rate = args.rows / scan, args.rows / run
        print(f"raw scan (mariadb --quick)   {scan:7.2f}s  {scan_rate:12,.0f} rows/s")
        print(f"tidemark run (end to end)    {run:7.2f}s  {run_rate:12,.0f} rows/s")
        print(f"ratio tidemark/scan          {run_rate / scan_rate:7.2f}x   (machine: {os.cpu_count()} cores,"
              f" master {args.master}, chunk {args.chunk_size:,}, {args.batch_chunks} chunks/batch)")
        return 0
    finally:
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
