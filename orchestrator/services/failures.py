"""What a failed run tells its user: one line with the root cause and the fix.

A Spark job that fails writing Parquet raises ``An error occurred while calling o150.parquet``;
the cause ("No space left on device") is several Java causes deep, and the JVM prints every
task's stack trace on its stderr. `describe` walks the Python and Java cause chains and
reduces them to the innermost cause a user can act on (`CAUSES`, a table: the first row
matching the innermost message wins); the full story goes to the run's log file
(`orchestrator.app.logs`), so the terminal shows only the one line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.errors import SourceTimeout

log = logging.getLogger(__name__)

_PATH = re.compile(r"(?:file:)?(/[^\s'\"(),:]+)")
_HOST_PORT = re.compile(
    r"host=(?P<h1>[^)\s]+)\)\(port=(?P<p1>\d+)|"
    r"\b(?:to|at) (?:address |host )?'?(?P<h2>[\w.-]+)'?:(?P<p2>\d{2,5})\b|"
    # libpq (PostgreSQL): connection to server at "db" (10.0.0.5), port 5432 failed
    r"\bserver at \"(?P<h3>[^\"]+)\"(?: \([^)]*\))?, port (?P<p3>\d+)"
)


def _host_port(message: str) -> str | None:
    """The first ``host:port`` a driver's message names, in the forms the drivers write it."""
    match = _HOST_PORT.search(message)
    if match is None:
        return None
    host = match["h1"] or match["h2"] or match["h3"]
    return f"{host}:{match['p1'] or match['p2'] or match['p3']}"


@dataclass(frozen=True, slots=True)
class Cause:
    """A failure reduced to what happened and what to do about it."""

    what: str
    fix: str
    #: The ``host:port`` a lost connection's message names (`_connection`), if it names one.
    server: str | None = None

    def __str__(self) -> str:
        return f"{self.what}; {self.fix}"


def _path_in(message: str) -> str:
    match = _PATH.search(message)
    return f" on {match.group(1)}" if match else ""


def _no_space(message: str) -> Cause:
    return Cause(
        f"no space left on device{_path_in(message)}",
        "free space there (or point output.path / output.staging at a larger volume), then rerun",
    )


def _denied(message: str) -> Cause:
    return Cause(
        f"permission denied{_path_in(message)}",
        "make it writable for this user (or change output.path / state.url), then rerun",
    )


def _not_dir(message: str) -> Cause:
    return Cause(
        f"a parent of the path is a regular file, not a directory{_path_in(message)}",
        "move that file away (or change output.path), then rerun",
    )


#: What `_connection` tells to check: the source, unless the lost server is another one the
#: run talks to (`root_cause`'s ``servers``).
_SOURCE_FIX = "check that the source is up (`tidemark doctor`), then rerun"


def _connection(message: str) -> Cause:
    where = _host_port(message)
    return Cause(f"connection lost{f' to {where}' if where else ''}", _SOURCE_FIX, where)


def _at(message: str) -> str:
    """`` <host:port>`` of the server ``message`` names, or ``""``."""
    return f" {found}" if (found := _host_port(message)) else ""


def _timeout(message: str) -> Cause:
    return Cause(
        f"no answer from the source{_at(message)} within source.read_timeout",
        "check that the server is not hung or overloaded (or raise source.read_timeout), "
        "then rerun: the run resumes",
    )


def _certificate(message: str) -> Cause:
    return Cause(
        f"the TLS certificate of the source{_at(message)} failed the check source.tls asks for",
        "give the CA that signed it in source.tls.ca (docs/source.md, TLS), or check that the "
        "certificate names source.host, then rerun",
    )


def _user_connections(message: str) -> Cause:
    found = re.search(r"User '([^']*)'.*current value: (\d+)", message)
    who = f" `{found.group(1)}`" if found else ""
    limit = f" ({found.group(2)})" if found else ""
    return Cause(
        f"the source user{who} opened more connections than it may hold at once{limit}, "
        "MAX_USER_CONNECTIONS",
        "raise it, or read with fewer Spark tasks at once (spark.master local[N], a cluster's "
        "cores; under Airflow, fewer tasks at once: airflow.pool_slots); `tidemark doctor` "
        "says what a run holds; then rerun: the run resumes",
    )


def _access_denied(message: str) -> Cause:
    denied = re.search(r"user '([^']*)'@'([^']*)'", message)
    host = re.search(r"Host '([^']*)' is not allowed", message)
    if denied:
        what = f"the source refused the login of user `{denied.group(1)}` from {denied.group(2)}"
    else:
        what = f"the source refused a login from {host.group(1) if host else 'this host'}"
    return Cause(
        f"{what} (access denied)",
        "the run's own connections had logged in: a Spark executor logs in from its own host "
        "(grant the user from the executors' hosts too, e.g. 'user'@'%'); a user created "
        "REQUIRE X509 shows source.tls.cert, which on a cluster needs the executors' key "
        "store in source.jdbc_url_params (docs/source.md, TLS); a password changed since the "
        "run began needs the new one; then rerun: the run resumes",
    )


def _out_of_memory(message: str) -> Cause:
    side = "executor" if "executor" in message.lower() else "driver"
    return Cause(
        f"the Spark {side} ran out of memory (Java OutOfMemoryError)",
        f"raise spark.conf spark.{side}.memory (or lower chunk_size), then rerun",
    )


def _readonly_state(message: str) -> Cause:
    return Cause(
        "the state store cannot be written (read-only database file or directory)",
        "make state.url's file and its directory writable, then rerun",
    )


#: SQLite's busy timeout ran out (SQLITE_BUSY, as sqlite3 words it): another process kept the file.
SQLITE_BUSY = re.compile(r"database is locked")


def _locked_state(message: str) -> Cause:
    return Cause(
        "the state store's SQLite file (or the Iceberg catalog's) stayed locked by another "
        "process past the busy timeout",
        "find the process holding it (`fuser` on state.url's file, or on output.catalog's uri "
        "when it names a file of its own: a stopped or hung run, a tool with a transaction "
        "open) and end it, then try again (a run resumes where it stopped)",
    )


#: (pattern on one message of the chain, what it means): the first row that matches wins.
CAUSES: tuple[tuple[re.Pattern[str], Callable[[str], Cause]], ...] = (
    (re.compile(r"No space left on device|ENOSPC|Errno 28\b|Disk quota exceeded", re.I), _no_space),
    (
        re.compile(
            r"ParentNotDirectoryException|Not a directory|ENOTDIR|Errno 20\b|is not a directory",
            re.I,
        ),
        _not_dir,
    ),
    (
        re.compile(r"readonly database|read-only database|unable to open database file", re.I),
        _readonly_state,
    ),
    (SQLITE_BUSY, _locked_state),
    (
        re.compile(
            r"Permission denied|AccessDeniedException|EACCES|Errno 13\b|Mkdirs failed to create",
            re.I,
        ),
        _denied,
    ),
    (re.compile(r"OutOfMemoryError|Java heap space|GC overhead limit", re.I), _out_of_memory),
    (  # before `_connection`: Connector/J words it "Could not connect to ..."
        re.compile(r"exceeded the 'max_user_connections' resource", re.I),
        _user_connections,
    ),
    (  # a JDBC driver's (a Spark read's) only: a state store on MySQL words its refusal alike;
        # before `_connection`: Connector/J words it "Could not connect to ..."
        re.compile(
            r"SQL\w*Exception: [^\n]*?"
            r"(?:Access denied for user '|Host '[^']*' is not allowed to connect)",
            re.I,
        ),
        _access_denied,
    ),
    (  # before `_connection`: Connector/J words a failed check "Could not connect to ..."
        re.compile(
            r"PKIX path building failed|unable to find valid certification path|"
            r"SSLHandshakeException|No subject alternative|CERTIFICATE_VERIFY_FAILED",
            re.I,
        ),
        _certificate,
    ),
    (
        re.compile(
            r"\(timed out\)|Read timed out|SocketTimeoutException|max_statement_time|"
            r"Query execution was interrupted",
            re.I,
        ),
        _timeout,
    ),
    (
        re.compile(
            r"Communications link failure|Connection refused|Socket fail to connect|"
            r"Connection reset|Lost connection|Server has gone away|Can't connect to|"
            r"Could not connect|"
            r"unexpected end of stream|Connection timed out",
            re.I,
        ),
        _connection,
    ),
)


def error_chain(exc: BaseException) -> list[str]:
    """The messages of an exception and, for a Spark/Py4J error, of its Java causes.

    PySpark's own message of a JDBC failure can hide the cause ("Couldn't connect
    to the database" for a missing table), so the Java ``getCause()`` chain is read.
    """
    messages = [str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__]
    throwable = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    while throwable is not None and len(messages) < 20:
        try:
            messages.append(str(throwable.toString()))
            throwable = throwable.getCause()
        except Exception:  # the JVM is gone or the object is not a Throwable
            break
    return messages


def messages(exc: BaseException) -> list[str]:
    """Every message of ``exc``'s cause chain, outermost first: Python causes and Java causes."""
    out: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(out) < 50:
        seen.add(id(current))
        out.append(f"{type(current).__name__}: {current}")
        out.extend(error_chain(current)[1:])
        current = current.__cause__ or current.__context__
    return out


def root_cause(
    exc: BaseException, source: str | None = None, servers: Mapping[str, str] | None = None
) -> Cause | None:
    """The innermost cause of ``exc`` a user can act on, or None when none is known.

    ``source`` (``host:port``) names the server of a lost connection whose messages do not.
    ``servers``: the other servers the run talks to (``host:port`` -> what it is: the state
    store, the Iceberg catalog); a lost connection to one of them names it, not the source.

    >>> err = OSError(28, "No space left on device")
    >>> str(root_cause(RuntimeError("An error occurred while calling o150.parquet")))
    'None'
    >>> try:
    ...     raise RuntimeError("An error occurred while calling o150.parquet") from err
    ... except RuntimeError as e:
    ...     print(root_cause(e).what)
    no space left on device
    """
    hung = _source_timeout(exc)
    if hung is not None:  # it says what was waited for, which the causes below it do not
        what, _, fix = str(hung).partition("; ")
        return Cause(what, fix)
    chain = messages(exc)[::-1]  # innermost first
    for i, message in enumerate(chain):
        for pattern, cause in CAUSES:
            if pattern.search(message):  # the details (a path, host:port) from the nearest message
                found = cause("\n".join(chain[i:]))
                lost = found.server
                if servers and lost is not None and lost in servers:
                    return Cause(
                        f"connection lost to {servers[lost]} at {lost}",
                        "check that it is up and reachable, then rerun",
                        lost,
                    )
                if found.what == "connection lost" and source:
                    return Cause(f"connection lost to {source}", found.fix, source)
                if found.what.endswith("from the source within source.read_timeout") and source:
                    return Cause(found.what.replace("source ", f"source {source} ", 1), found.fix)
                return found
    return None


def _source_timeout(exc: BaseException) -> SourceTimeout | None:
    """The `SourceTimeout` in ``exc``'s cause chain, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, SourceTimeout):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe(
    exc: BaseException, source: str | None = None, servers: Mapping[str, str] | None = None
) -> str:
    """One line for ``exc``: its root cause and the fix (``source``, ``servers``: as
    `root_cause` takes them), else its first line.

    >>> describe(ValueError("bad value\\n  at line 3"))
    'bad value'
    """
    cause = root_cause(exc, source, servers)
    if cause is not None:
        return str(cause)
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:500]
