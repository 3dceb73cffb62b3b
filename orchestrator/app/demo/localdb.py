"""A private, throwaway MariaDB server: for tests, the demo and benchmarks.

It runs ``mariadbd`` from the machine's ``mariadb-server`` package in its own
data directory on a free port, with the binlog settings the caller asks for,
and never touches a server the machine already runs.

Used as (tests/conftest.py's ``mariadb`` fixture does this)::

    server = LocalMariaDB.create()
    server.start()
    ...
    server.destroy()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

MARIADBD_CANDIDATES = ("/usr/sbin/mariadbd", "/usr/sbin/mysqld")

#: The settings Tidemark needs on a source.
GOOD_BINLOG: Mapping[str, str | None] = {
    "log-bin": "binlog",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",
}


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, and not handed out before by this process.

    The port is released before the caller binds it, so another process can still take it
    in between: `LocalMariaDB.start` checks that the server it reaches is its own."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _find(candidates: tuple[str, ...], name: str) -> str:
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"{name} not found; install Debian's mariadb-server package")


@dataclass
class LocalMariaDB:
    """One private ``mariadbd``.

    Args:
        datadir: its data directory (created by `create`).
        port: TCP port on 127.0.0.1.
        settings: server options as ``{"binlog-format": "ROW"}``; a value of ``None``
            is a bare flag (``--log-bin``); a key absent is the server's default,
            so leaving out ``log-bin`` starts a server with the binlog off.
        server_id: ``--server-id``.
    """

    datadir: Path
    port: int
    settings: dict[str, str | None] = field(default_factory=lambda: dict(GOOD_BINLOG))
    server_id: int = 1
    process: subprocess.Popen[bytes] | None = None
    _owns_dir: bool = False
    _picked_port: bool = False

    @classmethod
    def create(
        cls,
        settings: Mapping[str, str | None] | None = None,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        server_id: int = 1,
    ) -> LocalMariaDB:
        """Make a fresh data directory (about a second) and return a stopped server.

        Servers of one replication topology need distinct ``server_id``s."""
        root = Path(tempfile.mkdtemp(prefix="tidemark-mariadb-", dir=base_dir))
        datadir = root / "data"
        # A private tmpdir: servers sharing /tmp have collided on their temporary tables.
        (root / "tmp").mkdir()
        cmd = [
            _find(
                ("/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db"), "mariadb-install-db"
            ),
            "--no-defaults",
            f"--datadir={datadir}",
            f"--tmpdir={root / 'tmp'}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        if os.geteuid() == 0:
            cmd.append("--user=root")
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {result.stderr.strip()[-2000:]}")
        server = cls(
            datadir=datadir,
            port=port or free_port(),
            settings=dict(GOOD_BINLOG if settings is None else settings),
            server_id=server_id,
        )
        server._owns_dir = True
        server._picked_port = port is None
        return server

    # ------------------------------------------------------------------ lifecycle

    @property
    def socket_path(self) -> Path:
        return self.datadir.parent / "mysqld.sock"

    @property
    def log_path(self) -> Path:
        return self.datadir.parent / "mysqld.err"

    @property
    def pid_file(self) -> Path:
        """The server's pid file: ``kill $(cat <pid_file>)`` shuts it down cleanly."""
        return self.datadir.parent / "mysqld.pid"

    def command(self) -> list[str]:
        cmd = [
            _find(MARIADBD_CANDIDATES, "mariadbd"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.socket_path}",
            f"--pid-file={self.pid_file}",
            f"--log-error={self.log_path}",
            f"--tmpdir={self.datadir.parent / 'tmp'}",
            f"--server-id={self.server_id}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=256M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=200",
        ]
        if os.geteuid() == 0:
            cmd.append("--user=root")
        for key, value in self.settings.items():
            cmd.append(f"--{key}" if value is None else f"--{key}={value}")
        return cmd

    def start(self, timeout: float = 60.0) -> LocalMariaDB:
        """Start the server and wait until it accepts connections.

        A port this object picked (`create` without ``port``) that another process took in
        the meantime is replaced by a new one; a port the caller chose is an error."""
        for _ in range(5):
            if self._start_once(timeout):
                return self
            self.port = free_port()
        raise RuntimeError(f"mariadbd found no free port after 5 tries: {self._log_tail()}")

    def _start_once(self, timeout: float) -> bool:
        """True once this server accepts connections; False if its port was taken."""
        if self.running:
            return True
        (self.datadir.parent / "tmp").mkdir(exist_ok=True)
        logged_before = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, log = self.process.returncode, self._log_tail()
                self.process = None
                if self._picked_port and "Address already in use" in self._log_since(logged_before):
                    return False
                raise RuntimeError(f"mariadbd exited with {code}: {log}")
            if self._answers_as_itself():
                return True
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(
            f"mariadbd did not accept connections within {timeout}s: {self._log_tail()}"
        )

    def _answers_as_itself(self) -> bool:
        """Whether this server, not another one on the same port, accepts connections."""
        try:
            conn = self.connect()
        except pymysql.err.OperationalError:
            return False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@datadir")
                row = cur.fetchone()
        finally:
            conn.close()
        return row is not None and Path(str(row[0])).resolve() == self.datadir.resolve()

    def stop(self, timeout: float = 60.0) -> None:
        """Shut down cleanly (SIGTERM) and wait."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the server dies as in a crash; `start` recovers the same datadir."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, settings: Mapping[str, str | None] | None = None) -> LocalMariaDB:
        """Stop and start again on the same datadir and port, optionally with new settings."""
        self.stop()
        if settings is not None:
            self.settings = dict(settings)
        return self.start()

    def destroy(self) -> None:
        """Stop the server and remove its files."""
        self.kill()
        if self._owns_dir:
            shutil.rmtree(self.datadir.parent, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _log_since(self, offset: int) -> str:
        with contextlib.suppress(OSError), self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")
        return ""

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return "(no log)"

    # ------------------------------------------------------------------ access

    def connect(
        self, user: str = "root", password: str = "", database: str | None = None, **kwargs: Any
    ) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            password=password,
            database=database,
            connect_timeout=5,
            autocommit=True,
            **kwargs,
        )

    def execute(self, *statements: str, database: str | None = None) -> list[tuple[Any, ...]]:
        """Run statements as root; returns the rows of the last one."""
        conn = self.connect(database=database)
        try:
            rows: list[tuple[Any, ...]] = []
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                    rows = list(cur.fetchall())
            return rows
        finally:
            conn.close()

    def create_user(self, user: str, password: str, *, replication: bool = True) -> None:
        """A user with what Tidemark needs (SELECT, and the replication grants if asked)."""
        grants = "SELECT, REPLICATION SLAVE, REPLICATION CLIENT" if replication else "SELECT"
        self.execute(
            f"CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY '{password}'",
            f"GRANT {grants} ON *.* TO '{user}'@'%'",
        )

    # ------------------------------------------------------------------ replication

    def replicate_from(
        self, primary: LocalMariaDB, *, user: str = "tidemark_repl", password: str = "repl"
    ) -> None:
        """Make this server a GTID replica of ``primary`` (``MASTER_USE_GTID = slave_pos``, from
        the start of the primary's binlog) and start replicating. Give this one
        ``log-slave-updates`` in its settings for its binlog to hold what it replicates."""
        primary.execute(
            f"CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY '{password}'",
            f"GRANT REPLICATION SLAVE ON *.* TO '{user}'@'%'",
        )
        self.execute(
            f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {primary.port}, "
            f"MASTER_USER = '{user}', MASTER_PASSWORD = '{password}', "
            "MASTER_USE_GTID = slave_pos",
            "START SLAVE",
        )

    def catch_up(self, primary: LocalMariaDB, timeout: float = 60.0) -> str:
        """Wait until this replica applied everything in ``primary``'s binlog now; its GTID
        position."""
        gtid = str(primary.execute("SELECT @@gtid_binlog_pos")[0][0])
        waited = self.execute(f"SELECT MASTER_GTID_WAIT('{gtid}', {timeout})")[0][0]
        if int(waited) != 0:
            raise RuntimeError(
                f"replica on port {self.port} did not reach GTID {gtid} within "
                f"{timeout}s: {self.execute('SHOW SLAVE STATUS')}"
            )
        return gtid

    def source_config(
        self, user: str = "root", password: str | None = None, server_id: int = 54001
    ) -> dict[str, Any]:
        """A ``source:`` mapping for a pipeline config pointing at this server."""
        config: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": user,
            "server_id": server_id,
        }
        if password is not None:
            config["password"] = password
        return config
