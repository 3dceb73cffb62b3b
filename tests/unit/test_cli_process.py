"""The ``tidemark`` process (`cli.entry`): the cyclic garbage collector is paused while a command
imports its modules, and on, with those modules' objects frozen out of its passes, while the
command runs. `cli.main`, which tests call, leaves the collector alone. The process ends through
`cli.process`: what a normal exit does outside the process is done, the teardown is skipped."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.app import status
from orchestrator.app.cli import main
from tests.unit.test_cli_validate import GOOD, write

# Runs `entry` for `tidemark status` with the command replaced by one that reports the collector.
PROBE = """
import gc, sys
import orchestrator.app.status as status
seen = {}
def command(config, **options):
    seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count())
    return 0
status.status_command = command
from orchestrator.app import cli
sys.argv = ["tidemark", "status", "--config", sys.argv[1]]
code = cli.entry()
print(code, seen["enabled"], seen["frozen"])
"""


def config_file(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        {
            **GOOD,
            "output": {"path": str(tmp_path / "lake")},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        },
    )


def test_a_command_runs_with_the_collector_on_and_the_imports_frozen(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(config_file(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    code, enabled, frozen = done.stdout.split()
    assert (code, enabled) == ("0", "True"), done.stderr
    # everything the imports made: SQLAlchemy, pyarrow, the config's objects ...
    assert int(frozen) > 10_000


def test_main_leaves_the_collector_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Calls are counted, not the freeze count: an object frozen earlier in this process (a
    # preload's import freezes what is alive) may be freed meanwhile, which lowers the count.
    seen: dict[str, object] = {}
    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "disable", lambda: calls.append("disable"))

    def command(config: object, **options: object) -> int:
        seen.update(enabled=gc.isenabled())
        return 0

    monkeypatch.setattr(status, "status_command", command)
    assert main(["status", "--config", str(config_file(tmp_path))]) == 0
    assert seen == {"enabled": True}
    assert gc.isenabled() and calls == []


# The end of a probe: runs `entry` for `tidemark run --config <argv[1]>` with the step functions
# replaced by the probe's ``run_command`` and no Spark session started early.
STUBBED_RUN = """
early = types.ModuleType("orchestrator.app.early")
early.start_spark_early = lambda *args: None
run = types.ModuleType("orchestrator.app.run")
run.run_command = run_command
sys.modules.update({"orchestrator.app.early": early, "orchestrator.app.run": run})
from orchestrator.app import cli
sys.argv = ["tidemark", "run", "--config", sys.argv[1]]
sys.exit(cli.entry())
"""


def probe_config(tmp_path: Path, **spark: str) -> Path:
    """A valid pipeline for the probes (nothing is run against its source)."""
    return write(
        tmp_path,
        {
            **GOOD,
            "output": {"path": str(tmp_path / "lake")},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "spark": spark,
        },
    )


# A run whose step imports the engine, has pyarrow convert Python objects, and reports whether
# pandas was imported. ``first``: the process imported pandas before (the control: pyarrow then
# uses it, as before).
RUN_PROBE = (
    """
import sys, types
if sys.argv[2] == "first":
    import pandas
def run_command(config, **kwargs):
    import orchestrator.app.steps  # the engine, as the real command imports it
    import pyarrow as pa
    pa.array([1, 2]); pa.scalar(None, pa.int64()); pa.table({"a": ["x"]})
    print("pandas" in sys.modules, type(pa.table({"a": [1]}).to_pandas()).__name__)
    return 0
"""
    + STUBBED_RUN
)


@pytest.mark.parametrize(
    ("spark", "pandas", "imported"),
    [({}, "", "False"), ({"remote": "sc://127.0.0.1:15002"}, "", "False"), ({}, "first", "True")],
)
def test_a_run_imports_no_pandas(
    tmp_path: Path, spark: dict[str, str], pandas: str, imported: str
) -> None:
    """pyarrow's look for pandas (`orchestrator.services.lean`): a run leaves pandas unimported,
    with a Spark driver of its own or a Spark Connect server's, and pyarrow still converts to
    pandas when asked to; a process that imported pandas before keeps it."""
    config = probe_config(tmp_path, **spark)
    done = subprocess.run(
        [sys.executable, "-c", RUN_PROBE, str(config), pandas],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [imported, "DataFrame"]


# A run whose step prints pyarrow's allocator in the run's process and in a process it starts.
POOL_PROBE = (
    """
import subprocess, sys, types
def run_command(config, **kwargs):
    import pyarrow as pa
    child = "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    print(pa.default_memory_pool().backend_name, pa.array([1, 2]).sum().as_py())
    print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout)
    return 0
"""
    + STUBBED_RUN
)


def _default_allocator() -> str:
    """pyarrow's own default allocator on this platform."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    probe = "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


@pytest.mark.parametrize(("asked", "used"), [(None, "system"), ("jemalloc", "jemalloc")])
def test_a_run_takes_the_c_librarys_allocator(tmp_path: Path, asked: str | None, used: str) -> None:
    """`orchestrator.services.lean.system_allocator`: a run's Arrow buffers, and those of the
    processes it starts, come from ``malloc`` unless ARROW_DEFAULT_MEMORY_POOL names another."""
    config = probe_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if asked is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = asked
    done = subprocess.run(
        [sys.executable, "-c", POOL_PROBE, str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [used, "3", used]


@pytest.mark.parametrize(
    ("dag_id", "imported"), [("tidemark_shop", "False"), ("someone_elses", "True"), ("", "True")]
)
def test_an_airflow_task_process_of_a_tidemark_dag_imports_no_pandas(
    dag_id: str, imported: str
) -> None:
    """The DAG module, in a task process of a Tidemark DAG (Airflow's parsing context names the
    DAG), has pyarrow make its look for pandas first: importing the engine and converting values
    imports no pandas. Another DAG's task process, or a parse of every DAG (the DAG processor, a
    DagBag: no DAG named), leaves pyarrow as it is, for pandas objects of other code."""
    probe = (
        "import sys\n"
        "import orchestrator.app.airflow_dags\n"
        "import orchestrator.app.steps, pyarrow as pa\n"
        "pa.array([1, 2])\n"
        "print('pandas' in sys.modules, 'orchestrator.pipeline.capture.step' in sys.modules,"
        " pa.default_memory_pool().backend_name)"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "ARROW_DEFAULT_MEMORY_POOL")
    }
    if dag_id:
        env["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = dag_id
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # A Tidemark DAG's task takes the C library's allocator too (`test_a_run_takes_...`).
    allocator = "system" if imported == "False" else _default_allocator()
    assert done.stdout.split() == [imported, "True", allocator]


# Ends through `cli.process` after a `tidemark status` replaced by a command that prints more than
# a pipe holds, starts a thread that is still working when it returns and a thread pool it leaves
# idle, registers an atexit
# handler, and exits 3; another handler was registered before the command.
EXIT_PROBE = """
import atexit, concurrent.futures, sys, threading, time
from pathlib import Path
out = Path(sys.argv[2])
pools = []
atexit.register(lambda: (out / "before").write_text("ran"))
import orchestrator.app.status as status
def late():
    time.sleep(0.5)
    (out / "thread").write_text("ran")
def command(config, **options):
    atexit.register(lambda: (out / "during").write_text("ran"))
    threading.Thread(target=late).start()
    pools.append(concurrent.futures.ThreadPoolExecutor(2))  # left idle, never shut down
    pools[-1].submit(lambda: None).result()
    print("x" * 200_000)
    sys.stdout.write("end")
    return 3
status.status_command = command
from orchestrator.app import cli
sys.argv = ["tidemark", "status", "--config", sys.argv[1]]
cli.process()
print("not reached")
"""


def test_the_process_ends_with_what_a_normal_exit_does_outside_it(tmp_path: Path) -> None:
    """The command's exit code, its whole output through a pipe, its thread's work and every
    atexit handler, and no wait for an idle thread pool: `cli.process` skips only the
    interpreter's teardown. Standard output is
    buffered, as it is for a pipe unless ``PYTHONUNBUFFERED`` is set."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, str(config_file(tmp_path)), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stdout == "x" * 200_000 + "\nend"
    assert {p.name for p in tmp_path.iterdir() if p.read_text() == "ran"} == {
        "before",
        "during",
        "thread",
    }


def test_python_m_orchestrator_exits_with_the_command_s_code(tmp_path: Path) -> None:
    """``python -m orchestrator`` goes through `cli.process`: a good config validates (exit 0, its
    line on stdout), a missing file is exit 2 with one line on stderr."""
    good = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", "--config", str(config_file(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert good.returncode == 0 and ": ok — pipeline " in good.stdout, good.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", "--config", str(tmp_path / "none.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("tidemark: error: "), bad.stderr
