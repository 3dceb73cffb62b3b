"""Airflow's own processes for the end-to-end tests: api-server, scheduler, dag-processor.

They run in a temp AIRFLOW_HOME with a SQLite metadata DB and the LocalExecutor
(Airflow 3 has no SequentialExecutor; ``airflow standalone`` runs this same
pair), on a free port, with the SimpleAuthManager making every user an admin so
the test can get a JWT from ``/auth/token`` without a password. Every wait has a
deadline; every process is stopped by its own process group at the end.

With ``executor`` Celery's (a PostgreSQL metadata DB and a Redis broker given in
``extra_env``) the tasks run in Celery workers `start_celery_worker` starts, each with its own
working directory, ``TMPDIR`` and ``HOME``, as on machines of their own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from orchestrator.app.demo.localdb import free_port
from tests.dags.airflow_home import VENV_BIN, airflow_env

T = TypeVar("T")
PROCESSES = ("api-server", "scheduler", "dag-processor")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 1.0) -> T:
    """Call ``probe`` until it returns something other than None; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None:
                return value
        except (httpx.HTTPError, OSError) as exc:
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what}"
        + (f" (last error: {last_error})" if last_error else "")
    )


@dataclass
class AirflowStack:
    """One Airflow deployment in ``home``: its environment, processes and REST client."""

    home: Path
    extra_env: Mapping[str, str]
    executor: str = "LocalExecutor"
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    token: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(airflow_env(self.home))
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": self.executor,
                "AIRFLOW__CORE__PARALLELISM": "2",
                "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                "simple_auth_manager.SimpleAuthManager",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            }
        )
        env.update(self.extra_env)
        return env

    def start(self) -> AirflowStack:
        """``airflow db migrate``, then the three processes; returns once the API answers."""
        env = self.env()
        migrate = subprocess.run(
            [str(VENV_BIN / "airflow"), "db", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed: {migrate.stderr[-3000:]}")
        for name in PROCESSES:
            log = (self.home / f"{name}.log").open("wb")
            self.processes[name] = subprocess.Popen(
                [str(VENV_BIN / "airflow"), name],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,
            )
        wait_for("the api-server", self._healthy, timeout=240)
        self.token = wait_for("a JWT from /auth/token", self._get_token, timeout=60)
        return self

    def start_celery_worker(self, name: str, root: Path, env: Mapping[str, str] = {}) -> Path:
        """``airflow celery worker`` (one task at a time, serving no logs: several share the
        machine) in ``root/cwd`` with ``root/tmp`` as ``TMPDIR`` and ``root/home`` as ``HOME``;
        returns its log file."""
        for part in ("cwd", "tmp", "home"):
            (root / part).mkdir(parents=True, exist_ok=True)
        worker_env = self.env()
        worker_env.update(
            {"TMPDIR": str(root / "tmp"), "HOME": str(root / "home"), "PWD": str(root / "cwd")}
        )
        worker_env.update(env)
        log_path = root / "worker.log"
        command = [str(VENV_BIN / "airflow"), "celery", "worker", "--concurrency", "1"]
        command += ["--celery-hostname", f"{name}@tidemark", "--skip-serve-logs"]
        with log_path.open("wb") as log:
            self.processes[name] = subprocess.Popen(
                command,
                env=worker_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=root / "cwd",
                start_new_session=True,
            )
        wait_for(
            f"Celery worker {name}",
            lambda: True if "ready." in log_path.read_text(errors="replace") else None,
            timeout=180,
        )
        return log_path

    def _healthy(self) -> bool | None:
        self.check_alive()
        response = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=10)
        return True if response.status_code == 200 else None

    def _get_token(self) -> str | None:
        response = httpx.get(f"{self.base_url}/auth/token", timeout=10)
        return str(response.json()["access_token"]) if response.status_code in (200, 201) else None

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(
                    f"airflow {name} exited with {process.returncode}:\n{self.log_tail(name)}"
                )

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.home / f"{name}.log"
        if not path.exists():  # a Celery worker logs in its own directory
            path = self.home.parent / name / "worker.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def stop(self) -> None:
        """SIGTERM each process group, then SIGKILL what is left after a grace period."""
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(deadline - time.monotonic(), 0.1))
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # workers a SIGTERM left behind, too
            if process.poll() is None:
                process.wait(10)

    # ------------------------------------------------------------------ REST API

    def api(
        self, method: str, path: str, json: Any = None, expect: int | None = 200
    ) -> httpx.Response:
        """A call to ``/api/v2`` with the JWT; fails unless the status is ``expect`` (None: any)."""
        response = httpx.request(
            method,
            f"{self.base_url}/api/v2{path}",
            json=json,
            timeout=60,
            headers={"Authorization": f"Bearer {self.token}"},
        )
        if expect is not None and response.status_code != expect:
            raise AssertionError(
                f"{method} {path} -> {response.status_code}: {response.text[:2000]}"
            )
        return response
