"""Retry policies for talking to the source, as tenacity objects to pass in.

Only transient errors are retried: the connection was lost or refused by a
server that was up a moment ago, the server is out of connections, a lock wait
timed out, a deadlock was broken. Bad config (wrong password, unknown database,
missing table, missing privilege, bad SQL) fails at once.

"Can't connect" (2003/2002) is classed as transient because, for a source that
already worked, it means the server is restarting or failing over.
`orchestrator.source.connection.Source` never retries it on the *first* connection: a
wrong host or port there fails fast with a clear message instead of waiting
through every attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pymysql
import tenacity

from orchestrator.errors import BinlogConnectionLost, TransientReadError, first_line

log = logging.getLogger(__name__)

#: Client and server error codes meaning the connection is gone (or not there yet).
CONNECTION_ERRORS: frozenset[int] = frozenset(
    {
        2002,  # CR_CONNECTION_ERROR: can't connect through the socket
        2003,  # CR_CONN_HOST_ERROR: can't connect to the server (refused, unreachable)
        2006,  # CR_SERVER_GONE_ERROR: server has gone away
        2013,  # CR_SERVER_LOST: lost connection during query
        2055,  # CR_SERVER_LOST_EXTENDED
        1053,  # ER_SERVER_SHUTDOWN: server shutdown in progress
        1158,
        1159,
        1160,
        1161,  # ER_NET_READ_ERROR / READ_INTERRUPTED / ERROR_ON_WRITE / WRITE_INTERRUPTED
        1927,  # ER_CONNECTION_KILLED (MariaDB)
        4031,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8): disconnected for inactivity
    }
)

#: Errors worth another try on the same or a new connection.
TRANSIENT_ERRORS: frozenset[int] = CONNECTION_ERRORS | frozenset(
    {
        1040,  # ER_CON_COUNT_ERROR: too many connections
        1205,  # ER_LOCK_WAIT_TIMEOUT
        1213,  # ER_LOCK_DEADLOCK
    }
)


def error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a PyMySQL error, or None for anything else.

    >>> error_code(pymysql.err.OperationalError(2013, "Lost connection"))
    2013
    >>> error_code(ValueError("x")) is None
    True
    """
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def is_connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is unusable and must be opened again.

    PyMySQL raises ``InterfaceError(0, '')`` when a query is sent on a connection
    it already knows is closed.

    >>> is_connection_lost(pymysql.err.OperationalError(2006, "MySQL server has gone away"))
    True
    >>> is_connection_lost(pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"))
    False
    """
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    return error_code(exc) in CONNECTION_ERRORS


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a read or write that waited ``source.read_timeout`` for a server that
    accepted the connection but did not answer: a hung or overloaded source, not a lost one.

    Not retried: another try would wait as long again; the run fails and a rerun resumes.

    >>> is_timeout(pymysql.err.OperationalError(
    ...     2013, "Lost connection to MySQL server during query (timed out)"))
    True
    >>> is_timeout(pymysql.err.OperationalError(
    ...     2013, "Lost connection to MySQL server during query"))
    False
    """
    return error_code(exc) in (2006, 2013) and "timed out" in str(exc)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying could help: connection lost, too many connections, lock wait, deadlock.

    Args:
        exc: the exception a source call raised.

    >>> is_transient(pymysql.err.OperationalError(1213, "Deadlock found"))
    True
    >>> is_transient(pymysql.err.OperationalError(1045, "Access denied"))
    False
    >>> is_transient(pymysql.err.ProgrammingError(1146, "Table 'shop.t' doesn't exist"))
    False
    """
    if is_timeout(exc):
        return False
    return is_connection_lost(exc) or error_code(exc) in TRANSIENT_ERRORS


def _log_retry(state: tenacity.RetryCallState) -> None:
    outcome = state.outcome
    exc = outcome.exception() if outcome is not None else None
    wait = state.next_action.sleep if state.next_action is not None else 0.0
    # PyMySQL messages carry user and host names, never passwords.
    log.warning("source: %s; retrying in %.1fs (attempt %d)", exc, wait, state.attempt_number + 1)


def transient_retry(
    attempts: int = 5, max_wait: float = 10.0, initial_wait: float = 0.5
) -> tenacity.Retrying:
    """The default policy: exponential backoff with jitter, transient errors only.

    The last error is re-raised as itself (not wrapped in ``tenacity.RetryError``).

    Args:
        attempts: total tries, the first included.
        max_wait: the longest pause between two tries, in seconds.
        initial_wait: the first pause, in seconds; it doubles on each retry.

    >>> transient_retry(attempts=3).stop.max_attempt_number
    3
    """
    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential_jitter(
            initial=initial_wait, max=max_wait, jitter=initial_wait
        ),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=_log_retry,
        reraise=True,
    )


def _backing_off(
    attempts: int, retry: tenacity.retry_base, message: Callable[[BaseException, float, int], str]
) -> tenacity.Retrying:
    """Up to ``attempts`` tries while ``retry`` holds, backing off 2, 4, 8 ... up to 30 seconds;
    before each sleep a warning ``message(error, wait, retry number)``."""

    def log_retry(state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("%s", message(exc or RuntimeError(), wait, state.attempt_number))

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(max(1, attempts)),
        wait=tenacity.wait_exponential(multiplier=2, max=30),
        retry=retry,
        before_sleep=log_retry,
        reraise=True,
    )


def read_retry(attempts: int, what: str) -> tenacity.Retrying:
    """The policy of a snapshot read job: ``TransientReadError`` only (connection lost or
    refused), backing off 2, 4, 8 ... up to 30 seconds between tries.

    >>> read_retry(3, "batch 0").stop.max_attempt_number
    3
    """
    return _backing_off(
        attempts,
        tenacity.retry_if_exception_type(TransientReadError),
        lambda exc, wait, n: f"{what}: {first_line(exc)}; retry {n}/{attempts - 1} in {wait:.0f}s",
    )


def _binlog_lost(exc: BaseException) -> bool:
    return isinstance(exc, BinlogConnectionLost) or (
        is_connection_lost(exc) and not is_timeout(exc)
    )


def binlog_retry(attempts: int = 4) -> tenacity.Retrying:
    """The capture's policy: a dropped binlog connection (or one refused while reconnecting) is
    tried again, backing off 2, 4, 8 ... up to 30 seconds; each try resumes from the capture's
    last checkpoint, a transaction boundary, after dropping what was written since (so no
    change is lost or written twice). A timed-out wait is not retried (`is_timeout`).

    >>> binlog_retry().stop.max_attempt_number
    4
    """
    return _backing_off(
        attempts,
        tenacity.retry_if_exception(_binlog_lost),
        lambda exc, wait, n: (
            f"capture: {first_line(exc)}; reconnecting in {wait:.0f}s "
            f"(retry {n}/{attempts - 1}), from the last checkpoint"
        ),
    )
