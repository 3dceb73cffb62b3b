"""The terminal's log lines (`cli._configure_logging`): a command's handlers write to the
standard streams as they are when a line is logged, not as they were when the command began.

`cli.main` called in-process (tests, an embedding scheduler) leaves its handlers on the root
logger after it returns, and threads of the command may still log then. A handler that kept the
stream of its start wrote to a stream since closed (pytest's ``capsys`` closes its own at the
end of each test): ``ValueError: I/O operation on closed file``, printed by logging as
``--- Logging error ---`` instead of the line.
"""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

from orchestrator.app import cli
from tests.unit.test_cli_process import config_file


def _streams(monkeypatch: pytest.MonkeyPatch) -> tuple[io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    return out, err


def test_lines_logged_after_a_command_reach_the_streams_of_that_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_out, first_err = _streams(monkeypatch)
    assert cli.main(["validate", "--config", str(config_file(tmp_path))]) == 0
    first_out.close()  # as capsys closes its streams when a test ends
    first_err.close()
    out, err = _streams(monkeypatch)
    logging.getLogger("tidemark.test").warning("a thread of the command, after it returned")
    assert "Logging error" not in err.getvalue()
    assert "a thread of the command, after it returned" in err.getvalue()
    assert out.getvalue() == ""


def test_a_runs_lines_split_between_the_streams_of_that_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run`` sends its progress to stdout and keeps stderr for its failure."""
    _streams(monkeypatch)
    cli._configure_logging(False, quiet_stderr=True)
    out, err = _streams(monkeypatch)
    logging.getLogger("tidemark.test").info("progress")
    logging.getLogger("tidemark.test").error("the failure")
    logging.getLogger("tidemark.jvm").error("the JVM's own output: the log file only")
    assert "progress" in out.getvalue() and "the failure" not in out.getvalue()
    assert "the failure" in err.getvalue() and "progress" not in err.getvalue()
    assert "JVM" not in out.getvalue() + err.getvalue()
