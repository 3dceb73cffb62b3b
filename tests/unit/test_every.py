"""`tidemark run --every`: the duration it takes, the loop's schedule, what ends it (no source:
the runs are stand-ins that count; `tests/integration/test_cli_run.py` runs the real loop)."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest

from orchestrator.errors import ConfigError, RunFailed, SourceNotReady
from orchestrator.runtime.cli import build_parser, main
from orchestrator.runtime.every import parse_every, run_every, stop_on_sigterm


@pytest.mark.parametrize(("text", "seconds"), [("30", 30.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0),
                                               (" 2M ", 120.0), ("0.25", 0.25)])
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
    stop = threading.Event()
    starts: list[float] = []
    reported: list[BaseException] = []
    outcomes: list[BaseException | None] = [None, RunFailed("source lost"), SourceNotReady("down"), None, None]

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
    stop = threading.Event()
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

    assert run_every(0.01, run, lambda exc: getattr(exc, "exit_code", 1), threading.Event()) == 2
    assert calls == [1]


def test_a_stop_set_while_waiting_ends_the_wait() -> None:
    stop = threading.Event()
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
