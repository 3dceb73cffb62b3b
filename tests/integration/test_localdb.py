"""`orchestrator.demo.localdb`: the stop command `tidemark demo --keep` prints works."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.demo.localdb import LocalMariaDB
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
