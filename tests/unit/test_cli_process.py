"""The ``tidemark`` process (`cli.entry`): the cyclic garbage collector is paused while a command
imports its modules, and on, with those modules' objects frozen out of its passes, while the
command runs. `cli.main`, which tests call, leaves the collector alone."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.runtime import status
from orchestrator.runtime.cli import main
from tests.unit.test_cli_validate import GOOD, write

# Runs `entry` for `tidemark status` with the command replaced by one that reports the collector.
PROBE = """
import gc, sys
import orchestrator.runtime.status as status
seen = {}
def command(config):
    seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count())
    return 0
status.status_command = command
from orchestrator.runtime import cli
sys.argv = ["tidemark", "status", "--config", sys.argv[1]]
code = cli.entry()
print(code, seen["enabled"], seen["frozen"])
"""


def config_file(tmp_path: Path) -> Path:
    return write(tmp_path, {**GOOD, "output": {"path": str(tmp_path / "lake")},
                            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"}})


def test_a_command_runs_with_the_collector_on_and_the_imports_frozen(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, str(config_file(tmp_path))],
                          capture_output=True, text=True, timeout=120, check=True)
    code, enabled, frozen = done.stdout.split()
    assert (code, enabled) == ("0", "True"), done.stderr
    # everything the imports made: SQLAlchemy, pyarrow, the config's objects ...
    assert int(frozen) > 10_000


def test_main_leaves_the_collector_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def command(config: object) -> int:
        seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count())
        return 0

    monkeypatch.setattr(status, "status_command", command)
    frozen = gc.get_freeze_count()
    assert main(["status", "--config", str(config_file(tmp_path))]) == 0
    assert seen == {"enabled": True, "frozen": frozen}
    assert gc.isenabled() and gc.get_freeze_count() == frozen
