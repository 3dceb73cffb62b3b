"""The services the tests start for themselves, each private, on a free port of 127.0.0.1:
PostgreSQL (a cluster of Debian's ``postgresql`` initialized into a temporary directory), Redis
(Celery's broker) and an S3 endpoint (moto's server mode, which serves S3's HTTP API).

Each class starts its server in `start` and returns once it answers; `stop` ends it and removes
its directory. The session fixtures of tests/conftest.py hold them; nothing here skips: a
server that cannot start fails the tests that need it, with its log.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.app.demo.localdb import free_port

#: The keys of the S3 endpoint the tests use (moto accepts any; these prove nothing leaks).
S3_ACCESS_KEY = "tidemark-test-access"
S3_SECRET_KEY = "s3-secret-must-not-show"


def _wait(check: Any, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"{what} did not start (exit {proc.poll()}); its log:\n{tail}")


def _answers(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def postgres_bin(name: str) -> str:
    """A PostgreSQL server program (``initdb``, ``postgres``): on PATH, or the newest of
    Debian's ``/usr/lib/postgresql/<version>/bin``."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not candidates:
        raise RuntimeError(f"{name} not found: install Debian's postgresql (.ci/setup does)")
    return candidates[-1]


@dataclass
class LocalPostgres:
    """A private PostgreSQL cluster: trust authentication, user ``postgres``, listening on
    127.0.0.1 only. As root, the server runs as the ``postgres`` system user (PostgreSQL refuses
    root)."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"

    @classmethod
    def start(cls, timeout: float = 60.0) -> LocalPostgres:
        root = Path(tempfile.mkdtemp(prefix="tidemark-postgres-"))
        server = cls(root=root, port=free_port())
        as_user = _as_postgres_user(root)
        log = root / "postgres.log"
        initdb = [postgres_bin("initdb"), "-D", str(root / "data"), "-U", "postgres", "-A", "trust"]
        subprocess.run(
            [*as_user, *initdb, "-E", "UTF8", "--no-sync"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        with open(log, "ab") as out:
            settings = {
                "listen_addresses": "127.0.0.1",
                "unix_socket_directories": str(root),
                "fsync": "off",
                "max_connections": "200",
            }
            options = [arg for k, v in settings.items() for arg in ("-c", f"{k}={v}")]
            options += ["-D", str(root / "data"), "-p", str(server.port)]
            server.proc = subprocess.Popen(
                [*as_user, postgres_bin("postgres"), *options],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait(lambda: _pg_ready(server), "PostgreSQL", server.proc, log, timeout)
        return server

    def stop(self) -> None:
        _stop(self.proc, signal.SIGINT)  # fast shutdown
        shutil.rmtree(self.root, ignore_errors=True)


def _as_postgres_user(root: Path) -> list[str]:
    if os.geteuid() != 0:
        return []
    entry = pwd.getpwnam("postgres")
    os.chown(root, entry.pw_uid, entry.pw_gid)
    os.chmod(root, 0o700)
    return ["runuser", "-u", "postgres", "--"]


def _pg_ready(server: LocalPostgres) -> bool:
    import psycopg

    with psycopg.connect(server.admin_dsn) as conn:
        conn.execute("SELECT 1")
    return True


@dataclass
class LocalPgBouncer:
    """PgBouncer in transaction mode before a `LocalPostgres` database, as Airflow's Helm chart
    puts one before its: a client's transactions run on whichever of ``pool_size`` server
    connections is free. Debian's 1.18 keeps no prepared statement across them."""

    root: Path
    port: int
    database: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the database through the pooler."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    @classmethod
    def start(
        cls, postgres: LocalPostgres, database: str, pool_size: int = 2, timeout: float = 30.0
    ) -> LocalPgBouncer:
        program = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        root = Path(tempfile.mkdtemp(prefix="tidemark-pgbouncer-"))
        server = cls(root=root, port=free_port(), database=database)
        (root / "users.txt").write_text('"postgres" ""\n')
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": server.port,
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": root / "users.txt",
            "pool_mode": "transaction",
            "default_pool_size": pool_size,
            "max_client_conn": 200,
            "logfile": root / "pgbouncer.log",
        }
        (root / "pgbouncer.ini").write_text(
            f"[databases]\n{database} = host=127.0.0.1 port={postgres.port} dbname={database}"
            " user=postgres\n[pgbouncer]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items())
        )
        as_user = _as_postgres_user(root)  # it refuses to run as root
        for path in root.iterdir() if as_user else ():
            shutil.chown(path, "postgres", "postgres")
        server.proc = subprocess.Popen(
            [*as_user, program, str(root / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait(
            lambda: _answers(server.port), "PgBouncer", server.proc, root / "pgbouncer.log", timeout
        )
        return server

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class LocalRedis:
    """A private Redis server (no persistence), for Celery's broker and results."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, timeout: float = 30.0) -> LocalRedis:
        program = shutil.which("redis-server")
        if program is None:
            raise RuntimeError("redis-server not found: install Debian's redis-server")
        root = Path(tempfile.mkdtemp(prefix="tidemark-redis-"))
        server = cls(root=root, port=free_port())
        log = root / "redis.log"
        options = ["--port", str(server.port), "--bind", "127.0.0.1", "--save", ""]
        options += ["--appendonly", "no", "--dir", str(root), "--logfile", str(log)]
        server.proc = subprocess.Popen(
            [program, *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait(lambda: _answers(server.port), "Redis", server.proc, log, timeout)
        return server

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class MotoS3:
    """moto's server mode: S3's HTTP API on ``endpoint`` (path-style), buckets in memory."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    buckets: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, timeout: float = 60.0) -> MotoS3:
        root = Path(tempfile.mkdtemp(prefix="tidemark-s3-"))
        server = cls(root=root, port=free_port())
        log = root / "moto.log"
        with open(log, "ab") as out:
            server.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(server.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "MOTO_PORT": str(server.port)},
            )
        _wait(
            lambda: urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=2),
            "moto's S3 server",
            server.proc,
            log,
            timeout,
        )
        return server

    def client(self) -> Any:
        """A boto3 S3 client of this endpoint."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def keys(self, name: str, prefix: str = "") -> list[str]:
        """Every key of bucket ``name`` under ``prefix``."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=name, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)
