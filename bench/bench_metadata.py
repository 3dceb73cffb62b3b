"""The metadata side of a pipeline of many tables (issue 16), without Spark: how long planning, the
state store, ``tidemark status``, ``tidemark doctor`` and Airflow's parse of the DAG file take
with ``--tables`` tables matched by one pattern entry.

Each figure is one step on its own: `steps.preflight` and `steps.plan` of a new run (the pattern
expanded, ``P0``, the tables' shapes, each table's chunk plan, the plan recorded), the state
store's reads of that run (its tables, its chunks, the batches left), ``tidemark status`` and
``tidemark doctor`` as processes, and a ``DagBag`` parse of ``dags/`` whose trigger form lists
every table (Airflow's ``dagbag_import_timeout`` defaults to 30 s).

    .venv/bin/python bench/bench_metadata.py --tables 2000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_tables import COLUMNS, FILL  # noqa: E402
from bench.shop_lake import scratch_server  # noqa: E402


def timed(what: str, step: Callable[[], Any], figures: dict[str, float]) -> Any:
    started = time.perf_counter()
    result = step()
    figures[what] = time.perf_counter() - started
    print(f"  {what:<44} {figures[what]:7.2f}s", flush=True)
    return result


def process(*args: str, env: dict[str, str] | None = None) -> Callable[[], None]:
    return lambda: subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=100)
    args = parser.parse_args()
    from orchestrator.app import steps
    from orchestrator.config import load_config
    from orchestrator.pipeline.context import open_store
    from orchestrator.pipeline.plan.batches import pending_batches

    with scratch_server("tidemark-bench-metadata-") as (work, server):
        conn = server.connect()
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE many")
            cur.execute("USE many")
            for i in range(args.tables):
                cur.execute(f"CREATE TABLE many.t{i:04d} ({COLUMNS})")
                cur.execute(f"INSERT INTO many.t{i:04d} " + FILL.format(rows=args.rows))
        conn.close()
        configs = work / "configs"
        configs.mkdir()
        path = configs / "many.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "pipeline": "many",
                    "source": server.source_config(),
                    "output": {"path": str(work / "lake")},
                    "state": {"url": f"sqlite:///{work / 'state.db'}"},
                    "tables": [{"name": "many.*"}],
                }
            )
        )
        config = load_config(path)
        figures: dict[str, float] = {}
        print(f"{args.tables} tables of {args.rows} rows, one pattern entry:")
        timed("preflight (doctor's checks of the run)", lambda: steps.preflight(config), figures)
        handle = timed("plan a new run", lambda: steps.plan(config, holder="bench"), figures)
        print(f"    {handle}")
        store = open_store(config)
        try:
            timed("state: the run's tables", lambda: store.run_tables(handle.run_id), figures)
            timed("state: the run's chunks", lambda: store.chunks(handle.run_id), figures)
            timed(
                "state: batches left to read",
                lambda: pending_batches(store, handle.run_id),
                figures,
            )
            store.release_lock("many", "bench")
        finally:
            store.close()
        timed(
            "tidemark status (a process)",
            process("-m", "orchestrator", "status", "--config", str(path)),
            figures,
        )
        timed(
            "tidemark doctor (a process)",
            process("-m", "orchestrator", "doctor", "--config", str(path)),
            figures,
        )
        home = Path(tempfile.mkdtemp(dir=work))
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "TIDEMARK_CONFIG_DIR": str(configs),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        }
        code = (
            "import time; t = time.perf_counter(); "
            "from airflow.dag_processing.dagbag import BundleDagBag; "
            "b = BundleDagBag(dag_folder='dags', bundle_path='dags', bundle_name='dags-folder'); "
            "d = b.dags['tidemark_many']; "
            "n = len(d.params.get_param('tables').schema['items']['enum']); "
            "print(f'{time.perf_counter() - t:.2f} {n} {b.import_errors}')"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "? ? ?"
        seconds, choices, errors = [*last.split(" ", 2), "?", "?", "?"][:3]
        print(
            f"  {'Airflow DagBag parse of dags/ (in a process)':<44} {seconds:>7}s  "
            f"form choices: {choices}, "
            f"import errors: {errors}"
        )
        print(f"(machine: {os.cpu_count()} cores, shared, load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
