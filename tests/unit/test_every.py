"""`tidemark run --every`: the duration it takes, the loop's schedule, what ends it (no source:
the runs are stand-ins that count; `tests/integration/test_cli_run.py` runs the real loop)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.app import cli as cli_module
from orchestrator.app import early, logs, run
from orchestrator.app.cli import build_parser, main
from orchestrator.app.every import ProcessBroken, Stop, parse_every, run_every, stop_on_sigterm
from orchestrator.errors import ConfigError, RunFailed, SourceNotReady
from orchestrator.state.store import StateStore


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), (" 2M ", 120.0), ("0.25", 0.25)],
)
def test_every_takes_seconds_or_a_unit(text: str, seconds: float) -> None:
    assert parse_every(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5", "5d", "m", "", "soon", "inf", "nan"])
def test_every_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration such as 30, 90s, 5m or 1h"):
        parse_every(text)


def test_a_bad_every_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", "unused.yaml", "--every", "5 minutes"]) == 2
    err = capsys.readouterr().err
    assert "--every" in err and "'5 minutes'" in err and "5m" in err
    assert build_parser().parse_args(["run", "--config", "x.yaml", "--every", "5m"]).every == 300.0
    assert build_parser().parse_args(["run", "--config", "x.yaml"]).every is None


def test_runs_start_at_a_fixed_rate_and_failures_do_not_end_the_loop() -> None:
    stop = Stop()
    starts: list[float] = []
    reported: list[BaseException] = []
    outcomes: list[BaseException | None] = [
        None,
        RunFailed("source lost"),
        SourceNotReady("down"),
        None,
        None,
    ]

    def run() -> int:
        starts.append(time.monotonic())
        outcome = outcomes[len(starts) - 1]
        if len(starts) == len(outcomes):
            stop.set()
        if outcome is not None:
            raise outcome
        return 0

    def report(exc: BaseException) -> int:
        reported.append(exc)
        return 1

    assert run_every(0.2, run, report, stop) == 0
    assert len(starts) == 5
    assert [str(e) for e in reported] == ["source lost", "down"]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= 0.19 for gap in gaps), gaps  # each waits for its start, failed or not


def test_a_run_longer_than_the_interval_is_followed_at_once() -> None:
    stop = Stop()
    starts: list[float] = []

    def run() -> int:
        starts.append(time.monotonic())
        if len(starts) == 1:
            time.sleep(0.5)
        else:
            stop.set()
        return 0

    assert run_every(0.3, run, lambda exc: 1, stop) == 0
    assert len(starts) == 2
    assert starts[1] - starts[0] < 0.5 + 0.25  # not another full interval after the late end


def test_bad_config_ends_the_loop_with_its_exit_code() -> None:
    calls: list[int] = []

    def run() -> int:
        calls.append(1)
        raise ConfigError("no table matches --table shop.nope")

    assert run_every(0.01, run, lambda exc: getattr(exc, "exit_code", 1), Stop()) == 2
    assert calls == [1]


def test_a_stop_set_while_waiting_ends_the_wait() -> None:
    stop = Stop()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert run_every(600.0, lambda: 0, lambda exc: 1, stop) == 0
    assert time.monotonic() - started < 30  # not the 600 s interval


def test_sigterm_stops_after_the_run_and_a_second_one_interrupts_it() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_sigterm() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5), "the first SIGTERM sets the stop"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here, in the main thread
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_broken_process_ends_the_loop() -> None:
    def run() -> int:
        raise ProcessBroken("this process's Spark JVM ended")

    assert run_every(0.01, run, lambda exc: getattr(exc, "exit_code", 9), Stop()) == 1


def test_stop_set_from_another_thread_wakes_the_wait() -> None:
    stop = Stop()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    assert stop.wait(60) and time.monotonic() - started < 30
    stop.close()


def test_the_wait_works_with_file_descriptors_past_1024() -> None:
    """A process that ran for days may hold more than 1024 file descriptors: ``select`` refused
    the pipe's then ("filedescriptor out of range in select()"), and the loop ended."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        stop = Stop()
        assert min(stop._read, stop._write) > 1024  # the pipe past select()'s range
        started = time.monotonic()
        assert not stop.wait(0.05) and time.monotonic() - started >= 0.04
        threading.Timer(0.1, stop.set).start()
        assert stop.wait(60)
        stop.close()
    finally:
        for fd in held:
            os.close(fd)


def _loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: Callable[..., int], *argv: str
) -> int:
    """`main` of ``run --every`` with `run_command` replaced by ``fake`` (no source, no Spark)."""
    config = {
        "pipeline": "loop",
        "source": {"host": "127.0.0.1", "user": "snap", "password": "x", "server_id": 54009},
        "output": {"path": str(tmp_path / "lake")},
        "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "tables": [{"name": "shop.orders"}],
    }
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setattr(early, "start_spark_early", lambda *a, **k: None)
    monkeypatch.setattr(run, "run_command", fake)
    try:
        return main(["run", "--config", str(path), "--every", "0.05", *argv])
    finally:  # the run log main opened: closed, as the process's end would
        handler = logs._log_handler
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
            logs._log_handler = None


def test_snapshot_is_asked_for_until_a_run_plans_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []

    def fake(config: Any, *, snapshot: bool, planned: Callable[[], None], **kwargs: Any) -> int:
        asked.append(snapshot)
        if len(asked) == 1:
            raise RunFailed(
                "pipeline lock held by another run"
            )  # before planning: no run of it yet
        if len(asked) == 2:
            planned()
            raise RunFailed("source lost mid-read")  # planned, then failed: the next run resumes it
        if len(asked) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return 0

    assert _loop(tmp_path, monkeypatch, fake, "--snapshot") == 0
    assert asked == [True, True, False, False]


def test_a_run_whose_spark_jvm_died_ends_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[int] = []

    def fake(config: Any, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == 3:  # the loop went on: stop it, the assertion below fails
            os.kill(os.getpid(), signal.SIGTERM)
        raise RunFailed("An error occurred while calling o12.count")

    monkeypatch.setattr(cli_module, "_jvm_gone", lambda: 137)
    assert _loop(tmp_path, monkeypatch, fake) == 1
    assert calls == [1]
    assert "Spark JVM ended (exit status 137)" in capsys.readouterr().err


def test_a_lock_a_failed_run_left_with_the_process_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free: list[bool] = []

    def fake(config: Any, **kwargs: Any) -> int:
        store = StateStore(config.state.url)
        try:
            if not free:
                free.append(False)
                store.acquire_lock(config.pipeline, run.cli_holder())
                raise RunFailed("failed before the run released its lock")
            free.append(store.lock_info(config.pipeline) is None)
        finally:
            store.close()
        os.kill(os.getpid(), signal.SIGTERM)
        return 0

    assert _loop(tmp_path, monkeypatch, fake) == 0
    assert free == [False, True]
