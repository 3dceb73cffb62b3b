"""Spark JDBC reads of chunks: the SQL that converts each column, the JDBC settings, one job.

The job reads ``SELECT <per-type expressions> FROM (<table with converted
columns>) WHERE <chunk predicate>``, one JDBC partition per chunk (Spark's
``predicates``), so partition ``i`` of the job holds exactly chunk ``i``'s rows.
Each partition is written in the chunk key's order as one Parquet file, named
``part-<i>-...``, in the data file schema (published types, Iceberg field IDs, NOT NULL
columns required): it is the chunk's data file, which reconcile keeps as the first
version's file of that key range unless a change falls in it. After the job each file
is moved to its chunk's directory.

The key's order: a primary key of one integer or decimal column orders the same in MySQL and
in the files, and InnoDB reads a chunk along it (its rows are stored in it), so such a job
writes the rows as they come, then checks each file's key column strictly ascends; if one does
not (the server chose another index, a partitioned table returned one partition after another)
the job runs again with Spark's sort. Other keys are sorted at once, as are tables with a
``where`` (another index may serve it) or of other engines (MyISAM and Aria scan in storage
order): the check would mostly fail, the chunk read twice. Sorting cost 7% of the read's time.

Values follow docs/types.md without depending on the driver's
date/time handling: the server converts each column (`orchestrator.pipeline.read.sql`: temporal
values as integers, epoch microseconds, epoch days, signed TIME microseconds) and Spark turns
those into its types in a UTC session. Small tables are read by the driver instead, through the
same SQL (`orchestrator.pipeline.read.local`).

The read step that records the positions around a job is `orchestrator.pipeline.read.step`.
"""

from __future__ import annotations

import functools
import logging
import re
import urllib.parse
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from chunking.mysql import SESSION_SQL_MODE, UNBOUNDED_SELECTS
from orchestrator.config import TIME_ZONE, PipelineConfig
from orchestrator.errors import ConfigError, RunFailed, TransientReadError, source_timeout
from orchestrator.lake import iceberg, storage
from orchestrator.lake.writer import FIELD_ID, write_empty
from orchestrator.pipeline.read.sql import column_aliases, column_sql, source_query
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import srid_mismatch, staging_schema, staging_type
from orchestrator.services.failures import error_chain
from orchestrator.services.spark import apply_required_conf, job_description, spark_type
from orchestrator.source.connection import reads_session
from orchestrator.source.dialect import MARIADB_DRIVER, MYSQL_DRIVER
from orchestrator.source.tls import jdbc_settings

log = logging.getLogger(__name__)

#: Seconds the server waits on a slow reader of a streamed result before dropping it.
NET_WRITE_TIMEOUT = 600

#: Parquet writer options of the chunk files (a snapshot's data files): zstd without dictionary
#: pages, as `orchestrator.lake.writer.PARQUET_OPTIONS`. Measured (bench_read.py, 1M rows, 9
#: chunks, CPU seconds of the driver JVM and MariaDB, load 8, noise about 0.5 s): snappy 5.9,
#: zstd 6.3, zstd or snappy without dictionary pages 5.4; zstd files are 2.2x smaller than
#: snappy's, and pyarrow reads them back faster when a rewrite reads every file.
DATA_PARQUET_OPTIONS: dict[str, str] = {
    "compression": "zstd",
    "parquet.enable.dictionary": "false",
}

_PART = re.compile(r"^part-(\d+)-")

#: Words in a JDBC/Spark error that mean the connection was lost or refused (worth a retry).
TRANSIENT_MARKERS = (
    "SQLTransientConnectionException",
    "Communications link failure",
    "Connection refused",
    "Connection reset",
    "Broken pipe",
    "Socket fail",
    "unexpected end of stream",
    "socket was closed",
    "Server has gone away",
    "Lost connection",
    "Connection timed out",
    "Too many connections",
    "Deadlock found",
    "Lock wait timeout",
    "Connection is closed",
    "server shutdown",
)

#: Words of a read that waited source.read_timeout for a hung source: not retried (another try
#: would wait as long again); the run fails naming the source and what it was reading.
TIMEOUT_MARKERS = (
    "SocketTimeoutException",
    "Read timed out",
    "max_statement_time",
    "Query execution was interrupted",
)

#: Words that mean retrying cannot help, even when the error is also about connecting.
PERMANENT_MARKERS = ("Access denied", "SQLInvalidAuthorizationSpecException", "Unknown database")


@dataclass(frozen=True, slots=True)
class ColumnRead:
    """How one column travels: SQL on the server, JDBC type, Spark expression to its staging
    type."""

    sql: str
    jdbc_type: T.DataType
    to_staging: Callable[[Column], Column]


def _same(c: Column) -> Column:
    return c


def column_read(column: ColumnInfo) -> ColumnRead:
    """The read plan of one column: its `orchestrator.pipeline.read.sql.column_sql`, and how Spark
    takes what it returns.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> column_read(C("t", "time", "time(6)", True, datetime_precision=6)).jdbc_type
    LongType()
    """
    found = column_sql(column)
    match found.wire:
        case "boolean":
            return ColumnRead(found.sql, T.BooleanType(), _same)
        case "year":
            return ColumnRead(found.sql, T.ShortType(), _same)
        case "bits" | "time_micros":
            return ColumnRead(found.sql, T.LongType(), _same)
        case "text":
            return ColumnRead(found.sql, T.StringType(), _same)
        case "double":
            return ColumnRead(found.sql, T.DoubleType(), _same)
        case "epoch_days":
            return ColumnRead(found.sql, T.IntegerType(), F.date_from_unix_date)
        case "wall_micros":
            return ColumnRead(found.sql, T.LongType(), _micros_to_wall_clock)
        case "instant_micros":
            return ColumnRead(found.sql, T.LongType(), F.timestamp_micros)
        case "spatial":
            return ColumnRead(found.sql, T.BinaryType(), functools.partial(_wkb, column))
        case "as_is":
            return ColumnRead(found.sql, spark_type(staging_type(column)), _same)


def _wkb(column: ColumnInfo, c: Column) -> Column:
    """`orchestrator.schema.values.spatial_wkb` in Spark: the storage form without its 4 bytes of
    SRID, a value of another SRID than the column declares failing the job."""
    wkb = F.substring(c, 5, _MAX_BYTES)
    if column.srid is None:
        return wkb
    prefix = F.lit(bytearray(column.srid.to_bytes(4, "little")))
    message = F.lit(srid_mismatch(column, None))
    return F.when(
        F.substring(c, 1, 4) != prefix, F.raise_error(message).cast(T.BinaryType())
    ).otherwise(wkb)


#: `_wkb`'s substring length: past the end of any value (Spark's longest binary).
_MAX_BYTES = (1 << 31) - 1


def _micros_to_wall_clock(c: Column) -> Column:
    # In a UTC session the instant at these epoch micros shows the stored wall clock.
    return F.timestamp_micros(c).cast(T.TimestampNTZType())


# --------------------------------------------------------------------------- JDBC settings


@functools.cache
def driver_class(jar: str) -> str:
    """The JDBC driver class inside a Connector/J jar (MariaDB's or MySQL's); looked up once
    per jar and process (a read of many small tables asks once per table)."""
    try:
        with zipfile.ZipFile(jar) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile) as exc:
        raise RunFailed(f"source.jdbc_driver_jar: cannot open {jar}: {exc}") from exc
    if "org/mariadb/jdbc/Driver.class" in names:
        return MARIADB_DRIVER
    if "com/mysql/cj/jdbc/Driver.class" in names:
        return MYSQL_DRIVER
    raise RunFailed(f"source.jdbc_driver_jar: {jar} holds neither MariaDB nor MySQL Connector/J")


#: The reads' character sets, in ``sessionVariables``: each driver asks for utf8mb4 in its
#: handshake, but a server's ``init_connect`` runs after it (``SET NAMES utf8``, a classic of
#: my.cnf files), and a 4-byte character was then read as ``?``.
UTF8MB4 = ",".join(
    f"character_set_{part}='utf8mb4'" for part in ("client", "connection", "results")
)


UNBOUNDED = ",".join(f"{k}={v}" for k, v in UNBOUNDED_SELECTS.items())


def jdbc_url(config: PipelineConfig, driver: str) -> str:
    """``jdbc:mysql://host:port/?<Connector/J settings>`` plus the config's ``jdbc_url_params``;
    never the user's password (with a client certificate, the password this process gave its
    key store: `orchestrator.source.tls._key_store`). TLS as ``source.tls`` says
    (`orchestrator.source.tls.jdbc_settings`): in its default mode, the reads ask for it when
    the source offers it (`reads_session`), as every other connection of the run does;
    MariaDB's Connector/J asks for none unless told, and a server that requires it
    (``require_secure_transport``) refused every chunk read.

    Connector/J's own settings are in the URL: Spark's read with ``predicates`` (every chunk
    read) did not pass connection properties with upper-case letters on to the driver (seen in
    the server's general log), so the chunks were read without the session's ``time_zone`` and
    ``sql_mode``, as text rather than with server-side prepared statements, and a paused server
    hung the handshake for good (``socketTimeout``, tests/integration/test_hangs.py). The
    session variables: `SESSION_SQL_MODE` (the predicates' literals read as written),
    ``net_write_timeout``, REPEATABLE READ (`Dialect.isolation`: never rows a transaction
    has not committed), `UTF8MB4`, `UNBOUNDED_SELECTS`, and no statement time limit
    (`Dialect.statement_limit`: a chunk's statement is bounded by ``queryTimeout`` instead).
    ``jdbc:mysql:`` picks Spark's MySQL
    dialect (backquoted names); MariaDB's Connector/J 3 and later take that scheme only beside
    ``permitMysqlScheme`` (they read no chunk without it: "could not open a JDBC
    connection"), which version 2 ignores. MariaDB's driver streams whenever a fetch size is
    set, MySQL's needs ``useCursorFetch``; both then use server-side prepared statements, whose
    rows come in the binary protocol: numbers as bytes, not text the server formats and the
    driver parses again.
    """
    src = config.source
    session = reads_session(config)
    dialect = session.dialect
    unlimited = f",{dialect.statement_limit}=0" if dialect.statement_limit else ""
    if not TIME_ZONE.fullmatch(src.time_zone):  # checked by validate too
        raise ConfigError(
            f"source.time_zone: expected an offset like +00:00 or a zone name, "
            f"found {src.time_zone!r}"
        )
    params = {
        "socketTimeout": str(src.read_timeout * 1000),
        "connectTimeout": str(src.connect_timeout * 1000),
        "sessionVariables": (
            f"time_zone='{src.time_zone}',sql_mode='{SESSION_SQL_MODE}',"
            f"net_write_timeout={NET_WRITE_TIMEOUT},{dialect.isolation}='REPEATABLE-READ'"
            f"{unlimited},{UTF8MB4},{UNBOUNDED}"
        ),
        "tinyInt1isBit": "false",
        "yearIsDateType": "false",
        **(
            {"useCursorFetch": "true"}
            if driver == MYSQL_DRIVER
            else {"useServerPrepStmts": "true", "permitMysqlScheme": "true"}
        ),
        **jdbc_settings(src.tls, driver, lambda: session.tls),
        **{k: v for k, v in src.jdbc_url_params.items() if k.lower() not in ("user", "password")},
    }
    if driver == MYSQL_DRIVER:  # it URL-decodes each value: time_zone='+02:00' read ' 02:00'
        params = {k: urllib.parse.quote(v, safe="") for k, v in params.items()}
    host = f"[{src.host}]" if ":" in src.host else src.host  # an IPv6 address, as URLs write it
    return f"jdbc:mysql://{host}:{src.port}/?" + "&".join(f"{k}={v}" for k, v in params.items())


def jdbc_properties(config: PipelineConfig, driver: str) -> dict[str, str]:
    """Spark's JDBC options and the credentials (Connector/J's settings are in `jdbc_url`).

    ``queryTimeout``: no chunk's statement runs longer than ``source.read_timeout``."""
    return {
        "driver": driver,
        "user": config.source.user,
        "password": config.resolve_password(),
        "fetchsize": str(config.defaults.fetch_size),
        "queryTimeout": str(config.source.read_timeout),
    }


# --------------------------------------------------------------------------- the batch


def batch_frame(
    spark: SparkSession,
    config: PipelineConfig,
    table: TableInfo,
    predicates: Sequence[str],
    schema: pa.Schema | None = None,
) -> DataFrame:
    """The batch as a DataFrame; partition ``i`` reads ``predicates[i]``.

    In ``schema`` (a data file schema: published types, `iceberg.FIELD_ID` on each field) the
    columns carry their field IDs (Spark writes them to Parquet) and the NOT NULL ones are
    non-nullable (written ``required``, as Iceberg wants a required field): a NULL read from such
    a column fails the job rather than be written. Without it: staging types, all nullable.
    """
    reads = [column_read(c) for c in table.columns]
    aliases = column_aliases(table.columns)
    driver = driver_class(config.source.jdbc_driver_jar)
    props = jdbc_properties(config, driver)
    props["customSchema"] = ", ".join(
        f"{a} {r.jdbc_type.simpleString()}" for a, r in zip(aliases, reads, strict=True)
    )
    derived = source_query(table, aliases, [r.sql for r in reads])
    url = jdbc_url(config, driver)
    df = spark.read.jdbc(url, derived, predicates=list(predicates), properties=props)
    fields = schema if schema is not None else staging_schema(table.columns)
    columns = []
    for a, r, f in zip(aliases, reads, fields, strict=True):
        kind = spark_type(f.type)
        column = r.to_staging(F.col(a)).cast(kind)
        if schema is None:
            columns.append(column.alias(f.name))
            continue
        if not f.nullable:
            column = required(
                column, kind, f"table {table.name}: NULL read from NOT NULL column {f.name}"
            )
        field_id = int((f.metadata or {}).get(FIELD_ID, b"0"))
        columns.append(column.alias(f.name, metadata={"parquet.field.id": field_id}))
    return df.select(columns)


def required(column: Column, kind: T.DataType, message: str) -> Column:
    """``column`` as a non-nullable column to Spark (written ``required``); a NULL in it fails the
    job with ``message``: ``COALESCE(column, RAISE_ERROR(message), <a literal>)``, whose last
    argument is never reached."""
    return F.coalesce(column, F.raise_error(F.lit(message)).cast(kind), _filler(kind))


def _filler(kind: T.DataType) -> Column:
    """A non-null literal of ``kind``: the last argument of a COALESCE that makes a column
    non-nullable to Spark (never reached: `batch_frame` puts an error before it)."""
    if isinstance(kind, T.StringType):
        return F.lit("")
    if isinstance(kind, T.BinaryType):
        return F.lit(bytearray())
    if isinstance(kind, T.BooleanType):
        return F.lit(False)
    if isinstance(kind, T.DateType):
        return F.date_from_unix_date(F.lit(0))
    if isinstance(kind, T.TimestampType | T.TimestampNTZType):
        return F.timestamp_micros(F.lit(0)).cast(kind)
    return F.lit(0).cast(kind)


def read_chunks(
    spark: SparkSession,
    config: PipelineConfig,
    table_info: TableInfo,
    chunks: Sequence[tuple[int, str]],
    out_dir_for: Callable[[int], str],
    key: Sequence[str],
    guard: Callable[[], None] = lambda: None,
    schema: pa.Schema | None = None,
) -> dict[int, tuple[int, int]]:
    """Read a batch of chunks of one table in one Spark job, each into a data file.

    Each chunk's file is sorted by ``key`` (Spark's order, the layout's) and written in the
    data file schema (`iceberg.data_file_schema`: published types, field IDs, NOT NULL columns
    required): reconcile keeps it as the first version's file of the chunk's range unless a
    change falls in it (`orchestrator.pipeline.reconcile.rewrite`).

    Args:
        spark: the session (see `orchestrator.services.spark.get_session`).
        config: the pipeline config (source, JDBC jar, fetch size).
        table_info: the table's columns.
        chunks: ``(chunk index, SQL predicate on the raw table)`` per chunk.
        out_dir_for: the staging directory of a chunk index; a new one (its name is unique to
            this attempt: a directory a state store names is never replaced).
        key: the chunk key the files are sorted by.
        guard: called before the job and before its output is placed (the fence check: a
            process that lost the pipeline lock writes nothing more).
        schema: the table's data file schema (default: `iceberg.data_file_schema`, which opens
            the catalog: a read of many tables passes it, the catalog opened once).

    Returns:
        ``{chunk index: (rows, bytes)}`` for every chunk given.

    Raises:
        TransientReadError: the connection was lost or refused; worth another try.
        RunFailed: the job failed; the message names the table and chunks, never a password.
            Chunk directories of this batch are then left as they were before the call.
    """
    if not chunks:
        return {}
    apply_required_conf(spark)
    indexes = [index for index, _ in chunks]
    first = out_dir_for(indexes[0])
    attempt_dir = storage.join(
        storage.parent(first), f"_tmp-batch-{indexes[0]:06d}-{storage.attempt_tag()}"
    )
    guard()
    label = f"{table_info.name} chunks {indexes[0]}..{indexes[-1]}"
    job_description(spark, f"tidemark read {label}")
    schema = schema or iceberg.data_file_schema(config, table_info)

    def frame() -> DataFrame:
        return batch_frame(spark, config, table_info, [where for _, where in chunks], schema)

    names = [table_info.column(k).name for k in key]
    placed = write_chunks(
        config,
        frame,
        names,
        attempt_dir,
        label,
        [(i, out_dir_for(i)) for i in indexes],
        schema,
        guard,
        as_returned=server_order_kept(config, table_info, schema, names),
    )
    return dict(zip(indexes, placed, strict=True))


def write_chunks(
    config: PipelineConfig,
    frame: Callable[[], DataFrame],
    key: Sequence[str],
    attempt_dir: str,
    label: str,
    targets: Sequence[tuple[int, str]],
    schema: pa.Schema,
    guard: Callable[[], None],
    *,
    as_returned: bool,
) -> list[tuple[int, int]]:
    """Run the job: each partition of ``frame()`` in ``key`` order into ``attempt_dir`` (as the
    server returned it when ``as_returned``, then checked, see the module docstring; else
    sorted), then partition ``i``'s file moved to ``targets[i]`` (chunk index, directory);
    ``(rows, bytes)`` per partition. A failed job, or a file that cannot be read back, raises
    `_read_error` naming ``label``, its files deleted."""
    _write_job(config, frame, key, attempt_dir, label, sort=not as_returned)
    try:
        try:
            ordered = not as_returned or all_ascending(attempt_dir, key[0])
        except Exception as exc:  # a file that cannot be read back fails as the job would
            raise _read_error(config, label, exc) from None
        if not ordered:
            log.info(
                "%s: the server returned rows out of key order (another index, or a partitioned "
                "table); the job runs again, sorting them",
                label,
            )
            storage.delete_tree(attempt_dir)
            guard()
            _write_job(config, frame, key, attempt_dir, label, sort=True)
        guard()
        return _place_chunks(attempt_dir, targets, schema)
    finally:
        storage.delete_tree(attempt_dir)


def _write_job(
    config: PipelineConfig,
    frame: Callable[[], DataFrame],
    key: Sequence[str],
    attempt_dir: str,
    label: str,
    *,
    sort: bool,
) -> None:
    """One job writing ``frame()``'s partitions into ``attempt_dir``, each sorted by ``key`` when
    ``sort``; a failed job raises `_read_error`, its files deleted."""
    try:
        data = frame()
        if sort:
            data = data.sortWithinPartitions(*[F.col(k).asc_nulls_first() for k in key])
        (
            data.write.mode("overwrite")
            .option("maxRecordsPerFile", 0)
            .options(**DATA_PARQUET_OPTIONS)
            .parquet(storage.spark_uri(attempt_dir))
        )
    except Exception as exc:
        storage.delete_tree(attempt_dir)
        raise _read_error(config, label, exc) from None


def server_order_kept(
    config: PipelineConfig, table_info: TableInfo, schema: pa.Schema, key: Sequence[str]
) -> bool:
    """Whether a chunk of this table is written as the server returns it, then checked: its
    primary key is one integer or decimal column, it is an InnoDB table and it has no ``where``
    filter (the module docstring says why)."""
    primary = [c.lower() for c in table_info.primary_key]
    return (
        ordered_by_server(schema, key)
        and [k.lower() for k in key] == primary
        and (table_info.engine or "").lower() == "innodb"
        and not config.table_where(table_info.name)
    )


def ordered_by_server(schema: pa.Schema, key: Sequence[str]) -> bool:
    """Whether the server's order of ``key`` is the files' order: one integer or decimal column.

    >>> s = pa.schema([("id", pa.int64()), ("d", pa.decimal128(20, 0)), ("t", pa.string())])
    >>> ordered_by_server(s, ["id"]), ordered_by_server(s, ["d"]), ordered_by_server(s, ["t"])
    (True, True, False)
    >>> ordered_by_server(s, ["id", "d"])
    False
    """
    if len(key) != 1:
        return False
    kind = schema.field(key[0]).type
    return pa.types.is_integer(kind) or pa.types.is_decimal(kind)


def all_ascending(directory: str, column: str) -> bool:
    """Whether every Parquet file under ``directory`` holds ``column`` in strictly ascending
    order, without NULLs (a chunk key's values are unique and NOT NULL)."""
    for uri in storage.list_files(directory, suffix=".parquet", recursive=True):
        fs, path = storage.filesystem(uri)
        with fs.open_input_file(path) as handle:
            values = pq.read_table(handle, columns=[column]).column(0).combine_chunks()
        if values.null_count:
            return False
        if (
            len(values) > 1
            and not pc.all(pc.less(values.slice(0, len(values) - 1), values.slice(1))).as_py()
        ):
            return False
    return True


def _place_chunks(
    attempt_dir: str, targets: Sequence[tuple[int, str]], schema: pa.Schema
) -> list[tuple[int, int]]:
    """Move partition ``i``'s files into ``targets[i]``'s dir, named after its chunk index (base
    files have distinct names: `orchestrator.pipeline.reconcile.spark`); count rows and bytes."""
    by_partition: dict[int, list[str]] = {}
    for uri in storage.list_files(attempt_dir, suffix=".parquet"):
        match = _PART.match(storage.basename(uri))
        if match is None or int(match.group(1)) >= len(targets):
            raise RunFailed(
                f"unexpected file {uri} in the read output of {storage.parent(attempt_dir)}"
            )
        by_partition.setdefault(int(match.group(1)), []).append(uri)
    result: list[tuple[int, int]] = []
    for partition, (index, out_dir) in enumerate(targets):
        storage.makedirs(out_dir)
        rows = nbytes = 0
        files = by_partition.get(partition) or []
        for n, uri in enumerate(files):
            target = storage.join(out_dir, f"c{index:06d}-{n:03d}.parquet")
            storage.move(uri, target)
            rows += storage.parquet_rows(target)
            nbytes += storage.size(target)
        if not files:  # so every chunk dir has the schema
            nbytes = write_empty(storage.join(out_dir, f"c{index:06d}-000.parquet"), schema)
        result.append((rows, nbytes))
    return result


# --------------------------------------------------------------------------- errors


def is_transient_read_error(exc: BaseException) -> bool:
    """Whether a failed read job is worth another try (connection lost or refused, ...)."""
    text = "\n".join(error_chain(exc)).lower()
    if any(marker.lower() in text for marker in PERMANENT_MARKERS):
        return False
    return any(marker.lower() in text for marker in TRANSIENT_MARKERS)


def _read_error(config: PipelineConfig, label: str, exc: BaseException) -> RunFailed:
    """A one-line error for a failed read job, with any credential scrubbed: a
    `TransientReadError` when the connection was lost or refused (worth a retry)."""
    chain = error_chain(exc)
    if any(marker.lower() in "\n".join(chain).lower() for marker in TIMEOUT_MARKERS):
        src = config.source
        return source_timeout(f"{src.host}:{src.port}", src.read_timeout, f"the rows of {label}")
    sql = [m for m in chain[1:] if m.startswith("java.sql.")]
    cause = (sql[0] if sql else chain[-1]).strip().splitlines()[0]
    message = scrub(f"read of {label} failed: {cause[:500]}", config.resolve_password())
    return TransientReadError(message) if is_transient_read_error(exc) else RunFailed(message)


def scrub(text: str, secret: str) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***``.

    >>> scrub("login s3cr3t failed", "s3cr3t")
    'login *** failed'
    """
    return text.replace(secret, "***") if secret else text
