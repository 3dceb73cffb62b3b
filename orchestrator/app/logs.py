"""The run's log file: every log record of the process (INFO and up), every traceback and the
JVM's own output, so the terminal shows only the one line `orchestrator.services.failures`
makes of a failure. Old logs of the pipeline are pruned as a new one opens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import traceback
from datetime import UTC, datetime
from logging.handlers import RotatingFileHandler

from orchestrator.config import PipelineConfig
from orchestrator.lake import storage

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The log file of this process (`open_log`); the JVM's stderr goes there too.
_current_log: str | None = None
_log_handler: logging.FileHandler | None = None

#: A log file past this size moves to ``<name>.1`` (the one there to ``.2``, the oldest is
#: dropped): a process of ``run --every`` logs every run of its life into one file.
LOG_BYTES = 64 * 2**20
LOG_BACKUPS = 2


def _log_dirs(config: PipelineConfig) -> list[str]:
    """Where a run's log may go, best first: next to a SQLite state store, in the local
    staging directory, in the system's temporary directory."""
    dirs = []
    url = config.state.url
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        dirs.append(os.path.join(os.path.dirname(url[len("sqlite:///") :]) or ".", "logs"))
    if storage.is_local(config.staging_path):
        dirs.append(os.path.join(storage.local_path(config.staging_path), "logs"))
    dirs.append(os.path.join(tempfile.gettempdir(), "tidemark-logs"))
    return dirs


def open_log(config: PipelineConfig) -> str | None:
    """Open this process's log file and send every log record (INFO and up) to it; its path.
    Called again (``run --every``, tests), the log file it opened before is closed."""
    global _current_log, _log_handler
    if _log_handler is not None:
        logging.getLogger().removeHandler(_log_handler)
        _log_handler.close()
        _log_handler = _current_log = None
    name = f"{config.pipeline}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{os.getpid()}.log"
    for directory in _log_dirs(config):
        try:
            os.makedirs(directory, exist_ok=True)
            handler = RotatingFileHandler(
                os.path.join(directory, name),
                encoding="utf-8",
                maxBytes=LOG_BYTES,
                backupCount=LOG_BACKUPS,
            )
        except OSError:
            continue
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        handler.setLevel(logging.INFO)
        logging.getLogger().addHandler(handler)
        _log_handler, _current_log = handler, handler.baseFilename
        prune_logs(directory, config.pipeline)
        return _current_log
    return None


#: Run logs kept per pipeline: a log is deleted when it is neither among the newest
#: `KEEP_LOGS` nor younger than `KEEP_LOG_DAYS` (checked each time a run opens its log).
KEEP_LOGS = 20
KEEP_LOG_DAYS = 7.0


def prune_logs(
    directory: str,
    pipeline: str,
    *,
    keep: int = KEEP_LOGS,
    days: float = KEEP_LOG_DAYS,
    now: float | None = None,
) -> list[str]:
    """Delete the pipeline's old run logs in ``directory``; returns the paths deleted.

    Args:
        directory: where the logs are.
        pipeline: whose logs (``<pipeline>-<UTC time>-<pid>.log``).
        keep: the newest this many always stay.
        days: any younger than this stays too.
        now: the current time (seconds since the epoch), for tests.
    """
    pattern = re.compile(
        rf"{re.escape(pipeline)}-\d{{8}}T\d{{6}}Z-\d+\.log(\.\d+)?"
    )  # .1, .2: rotated
    try:
        names = [n for n in os.listdir(directory) if pattern.fullmatch(n)]
    except OSError:
        return []
    paths = sorted((os.path.join(directory, n) for n in names), key=_mtime, reverse=True)
    cutoff = (now if now is not None else datetime.now(UTC).timestamp()) - days * 86400
    deleted = []
    for path in paths[keep:]:
        if _mtime(path) < cutoff:
            with contextlib.suppress(OSError):
                os.remove(path)
                deleted.append(path)
    return deleted


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def current_log() -> str | None:
    """The path `open_log` opened, if any."""
    return _current_log


def record_trace(exc: BaseException) -> None:
    """Append ``exc``'s full traceback (Java's included) to the log file."""
    if _current_log is None:
        return
    with contextlib.suppress(OSError), open(_current_log, "a", encoding="utf-8") as out:
        out.write("".join(traceback.format_exception(exc)))
