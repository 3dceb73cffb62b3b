"""`orchestrator.app.demo.localdb`: the stop command `tidemark demo --keep` prints works."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import HAVE_MARIADB

pytestmark = [pytest.mark.integration]


def test_kill_of_the_pid_file_stops_the_server(tmp_path: Path) -> None:
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed (Debian package mariadb-server)")
    server = LocalMariaDB.create(base_dir=tmp_path)
    server.start()
    try:
        assert server.process is not None
        subprocess.run(["sh", "-c", f"kill $(cat {server.pid_file})"], check=True, timeout=30)
        assert server.process.wait(timeout=60) == 0  # a clean shutdown
    finally:
        server.destroy()


def test_a_picked_port_taken_by_another_server_is_replaced(tmp_path: Path) -> None:
    """The failover test's two servers once met on one port: the replica's start connected to
    the primary, took it for itself, and replication reported equal server ids."""
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed (Debian package mariadb-server)")
    first = LocalMariaDB.create(base_dir=tmp_path, server_id=1)
    second = LocalMariaDB.create(base_dir=tmp_path, server_id=2)
    chosen = LocalMariaDB.create(base_dir=tmp_path, port=first.port, server_id=3)
    try:
        first.start()
        second.port = first.port  # as if free_port had handed out the same port twice
        second.start()
        assert second.port != first.port
        assert second.execute("SELECT @@server_id") == [(2,)]
        assert first.execute("SELECT @@server_id") == [(1,)]
        with pytest.raises(RuntimeError, match="Address already in use"):
            chosen.start()  # a port the caller chose is not replaced
    finally:
        for server in (first, second, chosen):
            server.destroy()
