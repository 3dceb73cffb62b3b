"""A DAG run vs `tidemark run` on the same table, side by side (docs/airflow.md, "What a DAG run
costs").

Loads ``--rows`` orders of the sample shop into a private MariaDB and snapshots
``shop.orders`` twice, into two lakes: once with `tidemark run` (one process, one Spark
driver), once as a run of the generated DAG in a real Airflow (api-server, scheduler,
dag-processor, LocalExecutor: every task its own process, every ``read`` task and
``reconcile`` its own Spark driver). Then it changes 1,000 rows and runs both again (an
incremental run: nothing to read), ``--repeat`` times, interleaved. Each wall time is from the
start of the command (the REST trigger) to the published table; the Airflow processes are started
before and not counted. Beside each wall time is the CPU time it cost: the ``tidemark`` process's
(user + sys, its children included, from ``os.wait4``), and for a DAG run the CPU that every
process of the Airflow deployment (api-server, scheduler, dag-processor, executor workers and the
task processes they reaped) spent from the trigger to the end.

Then what Airflow's task runner costs by itself: DAGs of one and of six chained empty tasks
(``@task`` functions that return None), ``--repeat`` runs each, interleaved; a task's cost is the
difference divided by five (``--empty-only``: that alone). ``--idle-sleep`` sets the scheduler's
``scheduler_idle_sleep_time``; the CPU the idle deployment spends is printed first. Settings are
the README walk-through's: a pool of ``--pool`` slots, ``AIRFLOW__CORE__PARALLELISM=4``, one API
worker; the config's defaults for chunks.
``--connect``: both attach to one Spark Connect server (``spark.remote``), started before and
not counted, as a deployment keeps it running: no task starts a JVM.

    .venv/bin/python bench/bench_dag_vs_cli.py                  # 200,000 rows, --repeat 3
    .venv/bin/python bench/bench_dag_vs_cli.py --rows 50000 --pool 1
    .venv/bin/python bench/bench_dag_vs_cli.py --connect
    .venv/bin/python bench/bench_dag_vs_cli.py --empty-only --idle-sleep 0.2
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
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
#: The empty DAGs: one task, and six chained (a DAG run of Tidemark had six or seven).
NOOP_DAGS = {"bench_noop_1": 1, "bench_noop_6": 6}
NOOP_FILE = """from datetime import datetime
from airflow.sdk import DAG, task


def noop():
    return None


for dag_id, count in {dags!r}.items():
    with DAG(dag_id, schedule=None, start_date=datetime(2024, 1, 1), catchup=False) as dag:
        previous = None
        for i in range(count):
            current = task(task_id=f"noop_{{i}}")(noop)()
            if previous is not None:
                previous >> current
            previous = current
    globals()[dag_id] = dag
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def cli_run(config: Path) -> tuple[float, float]:
    """One ``tidemark run``: its wall time and CPU time (user + sys, children included)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    errors = process.stderr.read()  # read before waiting: a full pipe would block the run
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"tidemark run failed: {errors.decode(errors='replace')[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds of the processes under ``roots`` (themselves included) and of the children
    they reaped: utime + stime + cutime + cstime from ``/proc/<pid>/stat``."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(entry)] = int(fields[1])
            ticks[int(entry)] = sum(int(x) for x in fields[11:15])
    total, todo = 0, list(roots)
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += ticks.get(pid, 0)
        todo.extend(child for child, up in parent.items() if up == pid)
    return total / CLOCK_TICKS


def dag_run(stack: AirflowStack, dag_id: str = DAG_ID) -> tuple[float, float, dict[str, float]]:
    """Trigger the DAG, wait for it; the wall time, the CPU time of Airflow's processes meanwhile,
    and each task's summed duration (a skipped task: 0)."""
    roots = [p.pid for p in stack.processes.values()]
    cpu_before = tree_cpu(roots)
    start = time.perf_counter()
    run_id = stack.api(
        "POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}}
    ).json()["dag_run_id"]

    def finished() -> str | None:
        stack.check_alive()
        state = stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
        return str(state) if state in ("success", "failed") else None

    state = wait_for(f"DAG run {run_id}", finished, timeout=3600, interval=0.2)
    wall = time.perf_counter() - start
    cpu = tree_cpu(roots) - cpu_before
    if state != "success":
        raise SystemExit(f"DAG run {run_id} {state}; logs under {stack.home / 'logs'}")
    tasks: dict[str, float] = {}
    for ti in stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()[
        "task_instances"
    ]:
        took = 0.0
        if ti["start_date"] and ti["end_date"]:
            took = (
                dt.datetime.fromisoformat(ti["end_date"])
                - dt.datetime.fromisoformat(ti["start_date"])
            ).total_seconds()
        tasks[ti["task_id"]] = tasks.get(ti["task_id"], 0.0) + took
    return wall, cpu, tasks


def report(
    what: str,
    cli: tuple[float, float],
    dag: tuple[float, float],
    tasks: dict[str, float],
    cpu: bool = True,
) -> None:
    """One line per pair of runs; ``cpu=False`` where the CLI's CPU is not all counted (the Spark
    driver JVM of a snapshot is not reaped by ``tidemark``, which ends without waiting for it)."""
    detail = ", ".join(f"{k} {v:.1f}s" if v else f"{k} skipped" for k, v in tasks.items())
    cpus = (
        f" ({cli[1]:.2f} CPU s), DAG run {dag[0]:.2f}s ({dag[1]:.2f} CPU s): "
        f"{dag[0] / cli[0]:.2f}x wall, {dag[1] / cli[1]:.2f}x CPU"
        if cpu
        else f", DAG run {dag[0]:.2f}s: {dag[0] / cli[0]:.2f}x wall"
    )
    print(f"{what}: tidemark run {cli[0]:.2f}s{cpus}  (task time: {detail})", flush=True)


def medians(what: str, runs: list[tuple[float, float]]) -> tuple[float, float]:
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    print(f"  {what}: median {wall:.2f}s wall, {cpu:.2f} CPU s over {len(runs)}", flush=True)
    return wall, cpu


def idle_cpu(stack: AirflowStack, seconds: float = 20.0) -> None:
    """The CPU the deployment spends with nothing to run (its loops polling), per minute."""
    roots = [p.pid for p in stack.processes.values()]
    before = tree_cpu(roots)
    time.sleep(seconds)
    used = tree_cpu(roots) - before
    print(f"Airflow idle: {used * 60 / seconds:.1f} CPU s a minute", flush=True)


def task_runner_cost(stack: AirflowStack, repeat: int) -> None:
    """What Airflow's task runner costs per task: DAGs of 1 and 6 empty tasks, interleaved."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in NOOP_DAGS}
    for _ in range(repeat):
        for name in NOOP_DAGS:
            wall, cpu, _ = dag_run(stack, name)
            runs[name].append((wall, cpu))
            print(f"{name}: {wall:.2f}s, {cpu:.2f} CPU s", flush=True)
    one = medians("one empty task", runs["bench_noop_1"])
    six = medians("six empty tasks", runs["bench_noop_6"])
    print(
        f"Airflow's task runner, per empty task: {(six[0] - one[0]) / 5:.2f}s wall, "
        f"{(six[1] - one[1]) / 5:.2f} CPU s (a DAG run of one empty task: {one[0]:.2f}s, "
        f"{one[1]:.2f} CPU s)",
        flush=True,
    )


def parsed(stack: AirflowStack, dag_id: str) -> Callable[[], bool | None]:
    """A probe: True once the API knows the DAG."""
    return lambda: (
        True if stack.api("GET", f"/dags/{dag_id}", expect=None).status_code == 200 else None
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
    parser.add_argument(
        "--repeat", type=int, default=3, help="incremental runs of each, and empty DAG runs"
    )
    parser.add_argument(
        "--no-empty", action="store_true", help="skip the empty DAGs (the task runner's cost)"
    )
    parser.add_argument(
        "--empty-only", action="store_true", help="only the empty DAGs, no Tidemark run"
    )
    parser.add_argument(
        "--idle-sleep",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the scheduler's scheduler_idle_sleep_time (Airflow's default: 1)",
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
        dags = work / "dags"  # the repo's two DAG files and the empty DAGs
        dags.mkdir()
        for dag_file in (ROOT / "dags").glob("*.py"):
            (dags / dag_file.name).symlink_to(dag_file)
        (dags / "bench_noop.py").write_text(NOOP_FILE.format(dags=NOOP_DAGS))
        stack = AirflowStack(
            home=home,
            extra_env={
                "TIDEMARK_CONFIG_DIR": str(work / "configs"),
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                **(
                    {"AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(args.idle_sleep)}
                    if args.idle_sleep is not None
                    else {}
                ),
            },
        )
        try:
            stack.start()
            for dag_id in (DAG_ID, *NOOP_DAGS):
                wait_for(f"{dag_id} to be parsed", parsed(stack, dag_id), timeout=600, interval=2)
                stack.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
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
            print(f"airflow up; load average now {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
            idle_cpu(stack)
            if args.empty_only:
                task_runner_cost(stack, args.repeat)
                return 0
            cli = cli_run(cli_config)
            wall, cpu, tasks = dag_run(stack)
            report(f"snapshot of {args.rows:,} rows", cli, (wall, cpu), tasks, cpu=False)
            clis: list[tuple[float, float]] = []
            runs: list[tuple[float, float]] = []
            for _ in range(args.repeat):
                with conn.cursor() as cur:
                    cur.execute(
                        "UPDATE shop.orders SET amount = amount + 1 ORDER BY id DESC LIMIT 1000"
                    )
                conn.commit()
                clis.append(cli_run(cli_config))
                wall, cpu, tasks = dag_run(stack)
                runs.append((wall, cpu))
                report("incremental run, 1,000 updated rows", clis[-1], runs[-1], tasks)
            cli_median = medians("tidemark run, incremental", clis)
            dag_median = medians("DAG run, incremental", runs)
            print(
                f"incremental: DAG run / tidemark run {dag_median[0] / cli_median[0]:.2f}x wall, "
                f"{dag_median[1] / cli_median[1]:.2f}x CPU (medians of {args.repeat})",
                flush=True,
            )
            if not args.no_empty:
                task_runner_cost(stack, args.repeat)
        finally:
            stack.stop()
            conn.close()
    print(f"machine after: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
