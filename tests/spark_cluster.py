"""A Spark standalone cluster on localhost, started from pyspark's own distribution.

One master and N workers, each ``bin/spark-class`` in its own process group,
all bound to 127.0.0.1, with their logs and the workers' executor directories
under a directory the caller owns. `StandaloneCluster.start` returns once every
worker has registered with the master; `stop` kills the process groups.

    cluster = StandaloneCluster.start(tmp_path, workers=2)
    try:
        ...  # spark.master = cluster.master_url
    finally:
        cluster.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.app.demo.localdb import free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """pyspark's distribution: ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def cluster_env(log_dir: Path) -> dict[str, str]:
    """The environment of the daemons, and of a driver that talks to them."""
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(log_dir),
            "SPARK_DAEMON_MEMORY": "256m",  # the master's and workers' own heaps
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    return env


@dataclass
class StandaloneCluster:
    """A running master and its workers (see the module docstring)."""

    root: Path
    master_url: str
    master_ui: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        timeout: float = 120.0,
    ) -> StandaloneCluster:
        """Start a master and ``workers`` workers; wait until all are registered.

        Raises:
            RuntimeError: a daemon exited, or the workers did not register in time;
                the message carries the tail of its log.
        """
        root.mkdir(parents=True, exist_ok=True)
        port, ui_port = free_port(), free_port()
        cluster = cls(
            root=root,
            master_url=f"spark://127.0.0.1:{port}",
            master_ui=f"http://127.0.0.1:{ui_port}",
        )
        try:
            cluster._spawn(
                "master",
                MASTER_CLASS,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            )
            for i in range(workers):
                work_dir = root / f"worker-{i}"
                work_dir.mkdir(exist_ok=True)
                cluster._spawn(
                    f"worker-{i}",
                    WORKER_CLASS,
                    cluster.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work_dir),
                )
            cluster._wait_for_workers(workers, timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        try:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main_class, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=cluster_env(self.root / "logs"),
                cwd=self.root,
                start_new_session=True,
            )
        finally:
            log.close()
        self.processes.append(process)

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as response:
            data: dict[str, Any] = json.load(response)
            return data

    def _wait_for_workers(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"a Spark daemon exited with {process.returncode}:\n{self.log_tails()}"
                    )
            with contextlib.suppress(OSError, ValueError):
                alive = sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
                if alive >= count:
                    return
            time.sleep(0.5)
        raise RuntimeError(
            f"{alive} of {count} Spark workers registered within {timeout:.0f}s:\n"
            f"{self.log_tails()}"
        )

    def log_tails(self, chars: int = 1500) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def executor_dirs(self) -> dict[str, list[Path]]:
        """Per worker, the executor directories it ran (``<work-dir>/<app id>/<executor id>``)."""
        return {
            w.name: sorted(p for p in w.glob("app-*/*") if p.is_dir())
            for w in sorted(self.root.glob("worker-*"))
            if w.is_dir()
        }

    def stop(self) -> None:
        """Kill every daemon's process group (executors are children of their worker) and wait."""
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in reversed(self.processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()
