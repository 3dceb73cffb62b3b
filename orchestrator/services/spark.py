"""The SparkSession factory, and the Arrow -> Spark type correspondence of staging files.

Every Spark job of Tidemark runs on a session made by `get_session`, which
fixes what the output contract depends on, whatever else the pipeline's
``spark.conf`` says:

- session time zone UTC (JVMs too, ``-Duser.timezone=UTC``), so casts between
  instants and wall clocks never shift a value;
- Parquet timestamps written as INT64 ``TIMESTAMP_MICROS`` (never INT96), and no
  Julian/Gregorian rebasing (``CORRECTED``): MySQL, Arrow and Spark 3+ all use the
  proleptic Gregorian calendar, so ``1000-01-01`` stays ``1000-01-01``;
- the JDBC driver jar on ``spark.jars`` and the driver class path; for an object store, Hadoop's
  S3 connector on the driver's and executors' class paths (`SessionSettings.class_path`);
- failed tasks are retried in local mode too (`local_with_retries`);
- the driver JVM's stdout and stderr (its start-up banner, log4j's console output)
  go to the ``tidemark.jvm`` logger, at INFO (WARNING for log4j ERROR/FATAL lines),
  not to the process's stderr, which Airflow records as ERROR and the CLI mixes
  with its own output (`start_jvm`); its crash report, if it dies of a fatal error, goes beside
  the process's log file, not into the working directory (`crash_report`).

The rest of ``spark.conf`` passes through (``spark.driver.memory``, S3 settings, ...).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from subprocess import PIPE, STDOUT
from typing import Any

import pyarrow as pa
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from orchestrator.errors import RunFailed
from orchestrator.services import class_archive

log = logging.getLogger(__name__)
jvm_log = logging.getLogger("tidemark.jvm")

UTC_JAVA_OPTION = "-Duser.timezone=UTC"

#: The driver JVM's JIT compilers start on a method after ten times HotSpot's usual number of
#: calls and loops. A 1M-row snapshot's JVM spent about half its CPU compiling (C2 10.5 s, C1
#: 3.5 s, the read tasks 6.1 s) on two cores it shares with the read and the source; with fewer,
#: later compilations a 4M-row snapshot took 8-16% less CPU in the same wall time
#: (docs/performance.md). Code that stays hot is still compiled, a little later. A driver
#: ``extraJavaOptions`` that names ``CompileThresholdScaling`` replaces it.
JIT_JAVA_OPTION = "-XX:CompileThresholdScaling=10"

#: Settings kept off the driver JVM's command line, where ``ps`` shows them to every user of the
#: machine and a crash report copies them: those Spark itself redacts (its default
#: ``spark.redaction.regex``), such as the object store's keys (``fs.s3a.secret.key``). PySpark
#: launches the JVM with every setting as a ``--conf`` argument (`_launch` leaves these out);
#: the session gets them through the gateway instead (`get_session`'s builder).
WITHHELD_AT_LAUNCH = re.compile(r"(?i)secret|password|token|access[.]?key")

#: The name, beside this process's log file, of the driver JVM's crash report (HotSpot's
#: ``hs_err`` file; the JVM puts its process ID for ``%p``): ``<log>.jvm-crash-<pid>.log``.
CRASH_REPORT_SUFFIX = ".jvm-crash-%p.log"

#: SQL settings Tidemark's output depends on; applied on every session it uses.
REQUIRED_SQL_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.files.maxRecordsPerFile": "0",
    # data files carry the Iceberg field IDs of their columns' metadata (`parquet.field.id`)
    "spark.sql.parquet.fieldId.write.enabled": "true",
}

#: Defaults a pipeline's ``spark.conf`` may override.
DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.log.level": "WARN",
}


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What a session is started with: made from a pipeline's config by
    `orchestrator.pipeline.context.session_settings`.

    Attributes:
        app_name: the Spark application's name.
        master: a Spark master URL (``local[*]``, ``spark://...``, ``yarn``...).
        remote: a Spark Connect server (``sc://host:15002``) instead of ``master``, or None.
        conf: the pipeline's ``spark.conf``, and the object store's ``fs.s3a.*``.
        jars: jar files the driver and the executors need (the JDBC driver), shipped to the
            executors by Spark (``spark.jars``).
        class_path: jar files put on the driver's and the executors' class paths where they are
            (Hadoop's S3 connector and the AWS SDK, 690 MB: every machine has them at the same
            path, `orchestrator.services.jars`; shipping them would copy them per executor).
    """

    app_name: str
    master: str
    remote: str | None = None
    conf: Mapping[str, str] = field(default_factory=dict)
    jars: tuple[str, ...] = ()
    class_path: tuple[str, ...] = ()


def session_conf(settings: SessionSettings) -> dict[str, str]:
    """Every setting `get_session` starts a session with (for logs and tests)."""
    conf = dict(DEFAULT_CONF)
    conf.update(settings.conf)
    conf["spark.master"] = local_with_retries(
        settings.master, conf.get("spark.task.maxFailures", "4")
    )
    conf.setdefault("spark.app.name", settings.app_name)
    for jar in settings.jars:
        conf["spark.jars"] = _append(conf.get("spark.jars"), jar, ",")
        conf["spark.driver.extraClassPath"] = _append(
            conf.get("spark.driver.extraClassPath"), jar, ":"
        )
    for jar in settings.class_path:
        for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
            conf[key] = _append(conf.get(key), jar, ":")
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        conf[key] = _append(conf.get(key), UTC_JAVA_OPTION, " ")
    driver = conf["spark.driver.extraJavaOptions"]
    if "CompileThresholdScaling" not in driver:
        conf["spark.driver.extraJavaOptions"] = _append(driver, JIT_JAVA_OPTION, " ")
    conf.update(REQUIRED_SQL_CONF)
    return conf


def local_with_retries(master: str, attempts: str) -> str:
    """A local master that retries failed tasks, as cluster masters do.

    Local mode ignores ``spark.task.maxFailures``; its ``local[N,F]`` form is
    the only way to retry, e.g. a chunk whose connection dropped mid-read.

    >>> local_with_retries("local[*]", "4")
    'local[*,4]'
    >>> local_with_retries("local", "3")
    'local[1,3]'
    >>> local_with_retries("local[2,1]", "4"), local_with_retries("spark://m:7077", "4")
    ('local[2,1]', 'spark://m:7077')
    """
    match = re.fullmatch(r"local(?:\[(\d+|\*)\])?", master.strip())
    if match is None:
        return master
    return f"local[{match.group(1) or 1},{attempts}]"


def _append(current: str | None, item: str, sep: str) -> str:
    if not current:
        return item
    return current if item in current.split(sep) else f"{current}{sep}{item}"


def get_session(settings: SessionSettings) -> SparkSession:
    """The SparkSession for a pipeline; an already running session is reused.

    A reused session keeps its static settings (master, jars, memory); the SQL
    settings of `REQUIRED_SQL_CONF` are applied to it anyway.

    With ``remote`` the session is a Spark Connect client of that server (`remote_session`).
    """
    if settings.remote:
        return remote_session(settings.remote, settings.conf)
    if settings.master.startswith("local"):
        # A local JVM talks to itself only; this also spares the "resolves to a loopback
        # address" warning on machines whose hostname maps to 127.0.0.1.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = session_conf(settings)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    fresh = SparkSession.getActiveSession() is None
    started = time.monotonic()
    start_jvm(conf)
    spark = builder.getOrCreate()
    if fresh:
        log.info(
            "spark session started in %.1fs (master %s, %d cores)",
            time.monotonic() - started,
            spark.sparkContext.master or settings.master,
            spark.sparkContext.defaultParallelism,
        )
        started_conf = spark.sparkContext.getConf()  # spark-defaults.conf's settings too
        if stopped_at_exit(
            {"spark.eventLog.enabled": started_conf.get("spark.eventLog.enabled", "false")},
            spark.sparkContext.master or settings.master,
        ):
            _stop_at_exit(spark)
    apply_required_conf(spark)
    return spark


def stopped_at_exit(conf: Mapping[str, str], master: str) -> bool:
    """Whether the session is stopped when the process exits, rather than its JVM ended with
    it (``conf``: the started session's, ``spark-defaults.conf`` included): when it writes an
    event log (``spark.eventLog.enabled``), which only a stop finishes
    (a history server lists it as incomplete for good, and a rolling log keeps its
    ``.inprogress`` status), or when its executors are a cluster's, whose manager then sees the
    application finish rather than its driver vanish. A local run without an event log ends
    without: the stop costs time and changes nothing outside the process.

    >>> stopped_at_exit({}, "local[2]"), stopped_at_exit({}, "spark://m:7077")
    (False, True)
    >>> stopped_at_exit({"spark.eventLog.enabled": "true"}, "local[2]")
    True
    """
    logged = str(conf.get("spark.eventLog.enabled", "false")).strip().lower() == "true"
    return logged or not master.strip().startswith("local")


_STOPPED_AT_EXIT: set[int] = set()


def _stop_at_exit(spark: SparkSession) -> None:
    """`_stop` registered for the process's exit, once a session (a `run --every` process asks
    for its session at every run)."""
    if id(spark) not in _STOPPED_AT_EXIT:
        _STOPPED_AT_EXIT.add(id(spark))
        atexit.register(_stop, spark)


#: Seconds the process's exit waits for its Spark session to stop (`_stop`): a cluster manager
#: that does not answer must not hold a finished run (or Airflow task) up.
STOP_WAIT_SECONDS = 60.0


def _stop(spark: SparkSession) -> None:
    """``spark.stop()`` at exit (registered after PySpark's own handler, so run before it ends
    the JVM), waited for `STOP_WAIT_SECONDS` at most; a JVM already gone (killed for its
    memory) has nothing left to finish. A Spark Connect session is released on its server,
    which would keep it, idle, for an hour."""
    started = time.monotonic()
    failed: list[BaseException] = []

    def stop() -> None:
        try:
            spark.stop()
        except Exception as exc:  # the process is exiting: say it, go on
            failed.append(exc)

    stopping = threading.Thread(target=stop, name="tidemark-spark-stop", daemon=True)
    try:
        stopping.start()
    except RuntimeError:  # Python 3.12+ starts no thread while the interpreter finalizes
        stop()
    else:
        stopping.join(STOP_WAIT_SECONDS)
    if stopping.is_alive():
        log.warning(
            "spark session not stopped within %.0f s at exit; the process ends without it",
            STOP_WAIT_SECONDS,
        )
    elif failed:
        first = str(failed[0]).splitlines()[0] if str(failed[0]) else type(failed[0]).__name__
        log.warning("spark session not stopped cleanly at exit: %s", first)
    else:
        log.info("spark session stopped in %.1fs", time.monotonic() - started)


def remote_session(remote: str, conf: Mapping[str, str]) -> SparkSession:
    """A Spark Connect session on ``remote``: no JVM in this process, the server's driver
    and executors do the work (docs/spark.md, "Spark Connect"). The server is started with the
    JDBC jar and fixes its own static settings; the runtime SQL settings of ``conf``
    (``spark.sql.*``) are set on the session, the others are the server's and are ignored."""
    started = time.monotonic()
    try:
        spark = SparkSession.builder.remote(remote).getOrCreate()
    except Exception as exc:  # grpc or missing client packages
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise RunFailed(
            f"spark.remote: cannot attach to the Spark Connect server {remote}: "
            f'{type(exc).__name__}: {first}; start it (docs/spark.md, "Spark Connect") and '
            "install the client (pip install 'tidemark[connect]')"
        ) from exc
    ignored = sorted(k for k in conf if not k.startswith("spark.sql."))
    for key, value in conf.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    if ignored:
        log.info(
            "spark.remote: settings %s belong to the Spark Connect server; not set",
            ", ".join(ignored),
        )
    apply_required_conf(spark)
    log.info("spark session attached to %s in %.1fs", remote, time.monotonic() - started)
    _stop_at_exit(spark)  # the server keeps a session until released (or idle an hour)
    return spark


def start_jvm(conf: Mapping[str, str]) -> None:
    """Start the driver JVM (unless one runs) with its output forwarded to `jvm_log`.

    The same launch PySpark makes on its own, plus ``popen_kwargs``, PySpark's hook
    for capturing the JVM's stdout/stderr, and the class-data-sharing archive of
    `orchestrator.services.class_archive`; the session then uses this gateway. Secrets
    (`WITHHELD_AT_LAUNCH`) stay off the command line: the session's builder sets them.
    """
    if SparkContext._gateway is not None:
        return
    plain = dict(conf)
    report = crash_report(conf.get("spark.driver.extraJavaOptions"))
    if report is not None:
        plain["spark.driver.extraJavaOptions"] = _append(
            conf.get("spark.driver.extraJavaOptions"), f"-XX:ErrorFile={report}", " "
        )
    launch = dict(plain)
    sharing = class_archive.java_options(conf)
    if sharing:
        launch["spark.driver.extraJavaOptions"] = _append(
            launch.get("spark.driver.extraJavaOptions"), sharing, " "
        )
    try:
        gateway = _launch(launch)
    except Exception as exc:  # the JVM ended before its gateway answered
        archive = class_archive.mapped(sharing)
        if archive is None:
            raise
        # An archive damaged after it was written (cut short by a copy, a full disk) crashes
        # the JVM that maps it, and every run after: removed, and the JVM started without it.
        written = _written(report)
        log.warning(
            "the driver JVM did not start with the class archive %s (%s%s); it is removed and "
            "the JVM started without it",
            archive,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            f"; its crash report: {written}" if written else "",
        )
        archive.unlink(missing_ok=True)  # the next JVM writes a new one
        gateway = _launch(plain)
    if gateway.proc is not None:  # None: an existing gateway (PYSPARK_GATEWAY_PORT)
        threading.Thread(
            target=forward_jvm_output,
            args=(gateway.proc.stdout,),
            name="tidemark-jvm-output",
            daemon=True,
        ).start()
    SparkContext._ensure_initialized(gateway=gateway)


def crash_report(java_options: str | None) -> str | None:
    """Where the driver JVM writes its crash report: beside this process's log file (the root
    logger's file, `orchestrator.app.logs.open_log`), named after it (`CRASH_REPORT_SUFFIX`),
    rather than in the working directory, which may be an Airflow task's, gone by the time
    anyone looks. None, the JVM's default, when this process logs to no regular file, when that
    file's path holds a space or a quote (Spark splits Java options there), or when
    ``java_options`` (the driver's ``extraJavaOptions``) name an ``ErrorFile`` of their own.

    >>> crash_report("-XX:ErrorFile=/var/log/jvm/hs_err_%p.log") is None
    True
    """
    if java_options is not None and "-XX:ErrorFile=" in java_options:
        return None
    for handler in logging.getLogger().handlers:
        path = getattr(handler, "baseFilename", None)
        if isinstance(handler, logging.FileHandler) and isinstance(path, str):
            stem = path.removesuffix(".log")
            if os.path.isfile(path) and not re.search(r"[\s'\"\\]", stem):
                return stem + CRASH_REPORT_SUFFIX
    return None


def _written(report: str | None) -> str | None:
    """The crash report the driver JVM wrote where `crash_report` said (a process starts its
    JVM again only after one failed: the newest is the last one's)."""
    if report is None:
        return None
    directory = os.path.dirname(report)
    head, _, tail = os.path.basename(report).partition("%p")
    with contextlib.suppress(OSError):
        found = [
            os.path.join(directory, name)
            for name in os.listdir(directory)
            if name.startswith(head) and name.endswith(tail)
        ]
        return max(found, key=os.path.getmtime, default=None)
    return None


def _launch(conf: Mapping[str, str]) -> Any:
    """PySpark's launch of the driver JVM, every setting but the secrets (`WITHHELD_AT_LAUNCH`)
    a ``--conf`` argument of its command line."""
    shown = [(k, v) for k, v in conf.items() if not WITHHELD_AT_LAUNCH.search(k)]
    return launch_gateway(
        SparkConf(loadDefaults=False).setAll(shown),
        popen_kwargs={"stdout": PIPE, "stderr": STDOUT},
    )


def jvm_gone() -> int | None:
    """The exit status of this process's driver JVM once it ended (killed for its memory, say):
    a session of it cannot be used again. None while it runs, or when none was started here."""
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    return proc.poll() if proc is not None else None


_LOG4J_SEVERE = re.compile(r"\b(ERROR|FATAL)\b")


def forward_jvm_output(stream: Iterable[bytes]) -> None:
    """Log each line of the JVM's output: INFO, or WARNING for a log4j ERROR/FATAL line."""
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            jvm_log.log(logging.WARNING if _LOG4J_SEVERE.search(line) else logging.INFO, "%s", line)


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def job_description(spark: SparkSession, text: str) -> None:
    """Name the next Spark jobs in the Spark UI (a Spark Connect session has no such call)."""
    if not is_connect(spark):
        spark.sparkContext.setJobDescription(text)


def parallelism(spark: SparkSession) -> int:
    """The session's default parallelism (the cores of a local master)."""
    if is_connect(spark):
        return int(spark.conf.get("spark.default.parallelism", None) or os.cpu_count() or 1)
    return int(spark.sparkContext.defaultParallelism)


def apply_required_conf(spark: SparkSession) -> None:
    """Set `REQUIRED_SQL_CONF` on ``spark`` (they are runtime settings)."""
    for key, value in REQUIRED_SQL_CONF.items():
        if spark.conf.get(key) != value:
            spark.conf.set(key, value)


# --------------------------------------------------------------------------- types

_SIMPLE: dict[pa.DataType, T.DataType] = {
    pa.bool_(): T.BooleanType(),
    pa.int8(): T.ByteType(),
    pa.int16(): T.ShortType(),
    pa.int32(): T.IntegerType(),
    pa.int64(): T.LongType(),
    pa.float32(): T.FloatType(),
    pa.float64(): T.DoubleType(),
    pa.string(): T.StringType(),
    pa.binary(): T.BinaryType(),
    pa.date32(): T.DateType(),
    pa.timestamp("us"): T.TimestampNTZType(),
    pa.timestamp("us", tz="UTC"): T.TimestampType(),
    # A published TIME column is Parquet INT64; Spark reads it back as micros.
    pa.duration("us"): T.LongType(),
}


def spark_type(arrow: pa.DataType) -> T.DataType:
    """The Spark type that writes (and reads) a staging Arrow type in Parquet.

    >>> spark_type(pa.decimal128(20, 0))
    DecimalType(20,0)
    >>> spark_type(pa.timestamp("us", tz="UTC"))
    TimestampType()
    """
    if pa.types.is_decimal(arrow):
        return T.DecimalType(arrow.precision, arrow.scale)
    try:
        return _SIMPLE[arrow]
    except KeyError:
        raise TypeError(f"no Spark type for staging Arrow type {arrow}") from None


def spark_schema(schema: pa.Schema) -> T.StructType:
    """A Spark schema with the names and `spark_type` of an Arrow schema (all nullable)."""
    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in schema])
