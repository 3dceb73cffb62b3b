"""`tidemark run --every`: one long-lived process runs the pipeline again and again.

A run's own work after a few thousand changes takes a fraction of a second; a fresh process
spends longer than that importing its libraries (pyiceberg, SQLAlchemy, pyarrow: about a
second on 2 cores) and, when a run reads, starting a JVM. A process that stays up pays both
once: each later run starts warm, and reuses the Spark session when it reads again.

Runs start at a fixed rate: the next one ``every`` seconds after the previous one started, at
once when a run took longer (said in the log). A run that fails is reported as a one-off run
reports it (one line on stderr, its log file) and the next one resumes it at the next start:
a source down for a while, a lock another process holds, a table that failed, all heal
without a restart. What a run cannot fix by trying again stops the loop with its exit code:
bad config or arguments (exit 2).

SIGTERM (a service manager's stop) ends the loop after the run in progress, exit 0; a second
SIGTERM, or SIGINT (Ctrl-C), interrupts that run as Ctrl-C does: the run is failed and
unlocked, and the next ``tidemark run`` resumes it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from orchestrator.errors import ConfigError, TidemarkError, first_line

log = logging.getLogger("tidemark")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_every(text: str) -> float:
    """``--every``'s value in seconds: a number of seconds, or one with a unit (``90s``,
    ``5m``, ``1.5h``); more than 0.

    Raises:
        ValueError: not such a duration (the message names the forms accepted).
    """
    value = text.strip().lower()
    scale = _UNITS.get(value[-1:])
    try:
        seconds = float(value[:-1] if scale is not None else value) * (scale or 1.0)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(
            f"expected a duration such as 30, 90s, 5m or 1h (more than 0), found {text!r}"
        )
    return seconds


class ProcessBroken(TidemarkError):
    """This process cannot run again (its Spark JVM is gone): the loop ends, exit 1, for the
    service manager to start a fresh one."""


class Stop:
    """The loop's stop request: set from a signal handler or another thread, waited on with a
    timeout. A flag and a pipe, no lock: a signal handler may interrupt the main thread
    anywhere, inside `threading.Event`'s own lock too."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._requested = False

    def set(self) -> None:
        self._requested = True
        with contextlib.suppress(
            BlockingIOError
        ):  # the pipe is full of earlier wake-ups: it wakes anyway
            os.write(self._write, b"x")

    def is_set(self) -> bool:
        return self._requested

    def wait(self, seconds: float) -> bool:
        """Until set or ``seconds`` passed; whether set. ``poll``, not ``select``: a process
        that runs for days may hold file descriptors numbered past ``select``'s 1024."""
        if not self._requested:
            poller = select.poll()
            poller.register(self._read, select.POLLIN)
            poller.poll(max(0, math.ceil(seconds * 1000)))
        return self._requested

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


def run_every(
    seconds: float, run: Callable[[], int], report: Callable[[BaseException], int], stop: Stop
) -> int:
    """Call ``run`` every ``seconds`` until ``stop`` is set; 0 then.

    ``report`` prints a run's failure and returns its exit code; a `ConfigError` or
    `ProcessBroken` ends the loop with that code, any other failure is retried at the next
    start. ``KeyboardInterrupt`` is not caught."""
    runs = 0
    while not stop.is_set():
        started = time.monotonic()
        runs += 1
        try:
            run()
        except (ConfigError, ProcessBroken) as exc:
            return report(exc)
        except Exception as exc:
            code = report(exc)
            log.warning(
                "run %d of this process failed (exit %d: %s); the next one starts in %s "
                "and resumes it",
                runs,
                code,
                first_line(exc),
                _span(max(0.0, started + seconds - time.monotonic())),
            )
        took = time.monotonic() - started
        if took >= seconds:
            log.warning(
                "the run took %s, longer than --every %s: the next one starts now",
                _span(took),
                _span(seconds),
            )
        stop.wait(max(0.0, started + seconds - time.monotonic()))
    log.info("stopped after %d run(s) of this process", runs)
    return 0


@contextmanager
def stop_on_sigterm() -> Iterator[Stop]:
    """A `Stop` SIGTERM sets (the loop ends after the run in progress); a second SIGTERM
    interrupts that run (KeyboardInterrupt). The previous handler is back afterwards."""
    stop = Stop()

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        # no logging here: a handler may run while the logging lock is held
        os.write(2, b"tidemark: stopping after the run in progress (SIGTERM again interrupts it)\n")

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop.close()


def _span(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"
