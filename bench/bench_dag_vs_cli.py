"""A DAG run vs `tidemark run` on the same table, side by side (docs/airflow.md, "What a DAG run
costs").

Loads ``--rows`` orders of the sample shop into a private MariaDB and snapshots
``shop.orders`` twice, into two lakes: once with `tidemark run` (one process, one Spark
driver), once as a run of the generated DAG in a real Airflow (api-server, scheduler,
dag-processor, LocalExecutor: every task its own process, every ``read`` task and
``reconcile`` its own Spark driver). Then it changes 1,000 rows and runs both again (an
incremental run: no ``read`` task). Each wall time is from the start of the command (the
REST trigger) to the published table; the Airflow processes are started before and not
counted. Settings are the README walk-through's: a pool of ``--pool`` slots,
``AIRFLOW__CORE__PARALLELISM=4``, one API worker; the config's defaults for chunks.
``--connect``: both attach to one Spark Connect server (``spark.remote``), started before and
not counted, as a deployment keeps it running: no task starts a JVM.

    .venv/bin/python bench/bench_dag_vs_cli.py                  # 200,000 rows
    .venv/bin/python bench/bench_dag_vs_cli.py --rows 50000 --pool 1
    .venv/bin/python bench/bench_dag_vs_cli.py --connect
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shop_lake import load_sample_shop, scratch_server  # noqa: E402
from orchestrator.app.demo.localdb import LocalMariaDB  # noqa: E402
from tests.e2e.stack import AirflowStack, wait_for  # noqa: E402
from tests.spark_connect import connect_server  # noqa: E402

PIPELINE = "bench_dag"
DAG_ID = f"tidemark_{PIPELINE}"


def machine() -> str:
    """Cores, memory and load: the numbers only mean something next to these."""
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {total / 1024 / 1024:.0f} GiB, load average {load}"


def write_config(
    path: Path, work: Path, server: LocalMariaDB, name: str, remote: str | None
) -> Path:
    spark: dict[str, Any] = {
        "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}
    }
    spark.update({"remote": remote} if remote else {"master": "local[*]"})
    config = {
        "pipeline": name,
        "source": server.source_config(),
        "spark": spark,
        "output": {"path": str(work / name / "lake")},
        "state": {"url": f"sqlite:///{work / name / 'state.db'}"},
        "tables": [{"name": "shop.orders"}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def cli_run(config: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - start


def dag_run(stack: AirflowStack) -> tuple[float, dict[str, float]]:
    """Trigger the DAG, wait for it; the wall time and each task's summed duration."""
    start = time.perf_counter()
    run_id = stack.api(
        "POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {}}
    ).json()["dag_run_id"]

    def finished() -> str | None:
        stack.check_alive()
        state = stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return str(state) if state in ("success", "failed") else None

    state = wait_for(f"DAG run {run_id}", finished, timeout=3600, interval=1)
    wall = time.perf_counter() - start
    if state != "success":
        raise SystemExit(f"DAG run {run_id} {state}; logs under {stack.home / 'logs'}")
    tasks: dict[str, float] = {}
    for ti in stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()[
        "task_instances"
    ]:
        if ti["start_date"] and ti["end_date"]:
            took = dt.datetime.fromisoformat(ti["end_date"]) - dt.datetime.fromisoformat(
                ti["start_date"]
            )
            tasks[ti["task_id"]] = tasks.get(ti["task_id"], 0.0) + took.total_seconds()
    return wall, tasks


def report(what: str, cli: float, dag: float, tasks: dict[str, float]) -> None:
    detail = ", ".join(f"{k} {v:.1f}s" for k, v in tasks.items())
    print(
        f"{what}: tidemark run {cli:.1f}s, DAG run {dag:.1f}s: {dag / cli:.2f}x  "
        f"(task time: {detail})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument(
        "--pool", type=int, default=2, help="slots of the source pool (Spark drivers at once)"
    )
    parser.add_argument(
        "--connect",
        action="store_true",
        help="both through one Spark Connect server (spark.remote), started before and not counted",
    )
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    with (
        scratch_server("tm-bench-dag-") as (work, server),
        contextlib.ExitStack() as stack_of_servers,
    ):
        remote = stack_of_servers.enter_context(connect_server(work)) if args.connect else None
        conn = load_sample_shop(server, args.rows)
        cli_config = write_config(work / "cli.yaml", work, server, "bench_cli", remote)
        write_config(work / "configs" / f"{PIPELINE}.yaml", work, server, PIPELINE, remote)
        home = work / "airflow"
        home.mkdir()
        stack = AirflowStack(
            home=home,
            extra_env={
                "TIDEMARK_CONFIG_DIR": str(work / "configs"),
                "AIRFLOW__CORE__PARALLELISM": "4",
            },
        )
        try:
            stack.start()
            wait_for(
                f"{DAG_ID} to be parsed",
                lambda: (
                    True
                    if stack.api("GET", f"/dags/{DAG_ID}", expect=None).status_code == 200
                    else None
                ),
                timeout=600,
                interval=2,
            )
            stack.api(
                "POST",
                "/pools",
                json={
                    "name": f"tidemark_{PIPELINE}_source",
                    "slots": args.pool,
                    "description": "bench",
                },
                expect=201,
            )
            stack.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
            print(f"airflow up; load average now {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
            cli = cli_run(cli_config)
            dag, tasks = dag_run(stack)
            report(f"snapshot of {args.rows:,} rows", cli, dag, tasks)
            with conn.cursor() as cur:
                cur.execute(
                    "UPDATE shop.orders SET amount = amount + 1 ORDER BY id DESC LIMIT 1000"
                )
            conn.commit()
            cli = cli_run(cli_config)
            dag, tasks = dag_run(stack)
            report("incremental run, 1,000 updated rows", cli, dag, tasks)
        finally:
            stack.stop()
            conn.close()
    print(f"machine after: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
