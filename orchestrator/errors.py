"""Every error Tidemark raises on purpose, with the CLI exit code it maps to.

Messages name the culprit (file, key, table, column, setting) and say the fix.
They never contain a secret: build them from names, never from URLs or DSNs.

May import: nothing of Tidemark's.
"""

from __future__ import annotations


class TidemarkError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with (docs/cli.md)."""

    exit_code = 1


class ConfigError(TidemarkError):
    """The pipeline config or the command-line arguments are wrong (exit 2).

    Carries every problem found, so a user fixes them all in one pass.
    """

    exit_code = 2

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class SourceNotReady(TidemarkError):
    """The source MySQL cannot be used as configured (exit 3): unreachable,
    bad credentials, binlog settings, privileges, missing tables."""

    exit_code = 3


class StateError(TidemarkError):
    """The state store is unreachable, or its schema is newer than this code."""


class RunLocked(StateError):
    """Another run of the same pipeline is active."""


class LockLost(StateError):
    """This process no longer holds the pipeline lock it worked under: another process took
    it over after the lease ran out (this one was paused, or could not renew it), or it was
    released by hand. The process stops without writing anything more; the other run goes on.
    """


class RunFailed(TidemarkError):
    """A run step failed; state is kept and a rerun resumes (exit 1)."""


class BinlogPurged(RunFailed):
    """Binlog files a run needs are gone from the server."""


class BinlogConnectionLost(RunFailed):
    """The binlog connection dropped: the capture is retried from its last checkpoint."""


class SourceTimeout(RunFailed):
    """The source accepted a connection but did not answer within ``source.read_timeout``.

    The message is ``<what was waited for>; <what to do>``: `orchestrator.services.failures`
    shows it as the run's one line, in preference to the "connection lost" in its causes.
    """


def source_timeout(address: str, seconds: int, waiting_for: str) -> SourceTimeout:
    """The one error of a hung source: which server, how long, what for; no secrets.

    >>> str(source_timeout("db1:3306", 600, "the binlog from b.000002:4")).split("; ")[0] == (
    ...     "no answer from the source db1:3306 for 600 s (source.read_timeout) while waiting for"
    ...     " the binlog from b.000002:4"
    ... )
    True
    """
    return SourceTimeout(
        f"no answer from the source {address} for {seconds} s (source.read_timeout) while waiting "
        f"for {waiting_for}; check that the server is not hung or overloaded (or raise "
        "source.read_timeout), then rerun: the run resumes"
    )


class TransientReadError(RunFailed):
    """A read lost or could not open its connection to the source: worth another try."""


def resnapshot_hint(table: str, config_path: object = None) -> str:
    """The one piece of advice for a table that must be read again from the source.

    >>> resnapshot_hint("shop.orders")
    're-snapshot it: tidemark run --table shop.orders --snapshot'
    >>> resnapshot_hint("shop.orders", "p.yaml")
    're-snapshot it: tidemark run --config p.yaml --table shop.orders --snapshot'
    """
    config = f" --config {config_path}" if config_path else ""
    return f"re-snapshot it: tidemark run{config} --table {table} --snapshot"


def first_line(exc: BaseException, limit: int = 500) -> str:
    """An error's first line (its type's name when it has no text), cut at ``limit`` characters.

    >>> first_line(ValueError("bad value\\n  at line 3"))
    'bad value'
    >>> first_line(KeyError())
    'KeyError'
    """
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:limit]


class SourceChanged(RunFailed):
    """Positions of one server were about to be used against another (a failover, a new
    replica, ``RESET MASTER``): never by file offset. The unfinished run is left behind and
    the next one goes on from the published positions by GTID (`orchestrator.binlog.failover`)."""


class GtidNotInBinlog(RunFailed):
    """The server cannot send its binlog from a GTID set: the set is not in its binlog (purged,
    diverged, another topology). What needed it is read again from the source."""
