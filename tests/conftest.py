"""Shared fixtures: a private MariaDB (session-scoped) and helpers to build configs.

Also the throwaway Airflow home and driver JVM class archives of the whole pytest process
(``pytest_configure``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import connect
from orchestrator.app.demo.verify import verify_table
from orchestrator.config import PipelineConfig, load_config
from orchestrator.pipeline.context import table_dir
from orchestrator.source.connection import Source
from tests.dags.airflow_home import SESSION_HOME, airflow_env
from tests.services import S3_ACCESS_KEY, S3_SECRET_KEY, LocalPostgres, LocalRedis, MotoS3

HAVE_MARIADB = shutil.which("mariadbd") is not None or Path("/usr/sbin/mariadbd").exists()

_SAVED_ENV = pytest.StashKey[dict[str, str | None]]()
_SAVED_JVM_CACHE = pytest.StashKey[str | None]()
_JVM_CACHE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Give Airflow a throwaway home before collection can import it.

    ``--doctest-modules`` (setup.cfg) imports every module of ``orchestrator``,
    ``orchestrator.app.airflow_dags`` (hence Airflow) included, and Airflow
    reads its configuration once, at first import: without this it would use
    (and create) ``~/airflow`` or the developer's own ``$AIRFLOW_HOME``, and the
    tests/dags fixture could no longer choose its home.

    The driver JVMs of the whole session share class archives
    (orchestrator/services/class_archive.py) in a directory of the session, as a user's runs
    share theirs: the first JVM of each class path writes one at its exit, and the JVMs after
    it map it, which takes seconds off each of the suite's many JVM starts. Neither the
    developer's own archives nor any left by another session are used.
    tests/integration/test_class_archive.py checks the archive in a directory of its own.
    """
    config.stash[_SAVED_JVM_CACHE] = os.environ.get("TIDEMARK_JVM_CACHE")
    jvm_cache = Path(tempfile.mkdtemp(prefix="tidemark-jvm-"))
    config.stash[_JVM_CACHE] = jvm_cache
    os.environ["TIDEMARK_JVM_CACHE"] = str(jvm_cache)
    if "airflow" in sys.modules:
        return  # too late to redirect; the tests/dags fixture reports it
    home = Path(tempfile.mkdtemp(prefix="tidemark-airflow-"))
    env = airflow_env(home)
    config.stash[_SAVED_ENV] = {key: os.environ.get(key) for key in env}
    config.stash[SESSION_HOME] = home
    os.environ.update(env)


def pytest_unconfigure(config: pytest.Config) -> None:
    saved = dict(config.stash.get(_SAVED_ENV, {}))
    saved["TIDEMARK_JVM_CACHE"] = config.stash.get(_SAVED_JVM_CACHE, None)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for directory in (config.stash.get(SESSION_HOME, None), config.stash.get(_JVM_CACHE, None)):
        if directory is not None:  # the session's home, its JVM class archives
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Undo what a test did to the root logger's handlers and level.

    Airflow (``dag.test()``) and ``cli.main`` attach handlers bound to the ``sys.stderr`` of
    the test that ran them, often a ``capsys`` stream closed once that test ends: a later
    test's INFO line would then go to a closed file (or to Airflow's format on its stderr).
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    """One private MariaDB with ROW/FULL/FULL binlog for the whole session.

    Tests create their own databases in it (name them after the test) so they
    do not see each other's tables.
    """
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed (Debian package mariadb-server)")
    server = LocalMariaDB.create(base_dir=tmp_path_factory.mktemp("mariadb"))
    server.start()
    yield server
    server.destroy()


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fresh_database(server: LocalMariaDB, name: str, *statements: str) -> None:
    """Database ``name`` made anew on ``server`` (dropped first if there), then ``statements``
    run in it."""
    server.execute(f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
    if statements:
        server.execute(*statements, database=name)


def load_pipeline(
    tmp_path: Path,
    server: LocalMariaDB,
    tables: list[dict[str, Any]],
    name: str = "test",
    **overrides: Any,
) -> PipelineConfig:
    """`pipeline_config`'s pipeline written to ``tmp_path/p.yaml`` and loaded."""
    return load_config(
        write_config(
            tmp_path / "p.yaml", pipeline_config(tmp_path, server, tables, name, **overrides)
        )
    )


def pipeline_config(
    tmp_path: Path,
    server: LocalMariaDB,
    tables: list[dict[str, Any]],
    name: str = "test",
    **overrides: Any,
) -> dict[str, Any]:
    """A complete pipeline config dict pointing at ``server``, with state and output under
    tmp_path."""
    config: dict[str, Any] = {
        "pipeline": name,
        "source": server.source_config(),
        "spark": {
            "master": "local[2]",
            "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
        },
        "output": {"path": str(tmp_path / "lake")},
        "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "defaults": {"chunk_size": 1000, "batch_chunks": 4, "read_margin_seconds": 0.05},
        "tables": tables,
    }
    config.update(overrides)
    return config


def chunked_config(
    tmp_path: Path,
    server: LocalMariaDB,
    tables: Iterable[str],
    name: str = "test",
    **overrides: Any,
) -> Path:
    """`pipeline_config` of the tables named ``tables``, written to ``tmp_path/p.yaml``, in
    chunks of 20,000 rows two to a batch with no read margin: a table of more rows than a
    run reads through the driver (``LOCAL_ROWS``) is read by Spark in a few chunks.
    ``overrides`` go to `pipeline_config` (``source=``, or other ``defaults=``)."""
    overrides.setdefault(
        "defaults", {"chunk_size": 20000, "batch_chunks": 2, "read_margin_seconds": 0.0}
    )
    return write_config(
        tmp_path / "p.yaml",
        pipeline_config(tmp_path, server, [{"name": t} for t in tables], name, **overrides),
    )


def assert_lake_equals_source(
    config: PipelineConfig | Path, server: LocalMariaDB, tables: Iterable[str]
) -> None:
    """Each published table equals its source table on ``server`` (``SELECT * ... WHERE`` the
    table's configured filter), row for row (the verify oracle)."""
    if not isinstance(config, PipelineConfig):
        config = load_config(config)
    conn = connect("127.0.0.1", server.port, "root", "")
    try:
        with Source.from_pipeline(config) as source:
            for name in tables:
                info = source.table_info(name)
                result = verify_table(
                    conn, info, info.primary_key, table_dir(config, name), config.table_where(name)
                )
                assert result.equal, f"{name}: {result.summary()}"
    finally:
        conn.close()


def start_run(config: Path, failpoint: str = "") -> subprocess.Popen[str]:
    """``tidemark run`` of ``config`` as a child process, stopped at ``failpoint`` if given
    (``TIDEMARK_FAILPOINT``, see orchestrator/services/faults.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_FAILPOINT"}
    if failpoint:
        env["TIDEMARK_FAILPOINT"] = failpoint
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


# --------------------------------------------------------------------------- other services
# Started by the fixtures as MariaDB is (tests/services.py): none is expected on the machine.

#: The variables `output.s3` of the S3 tests names (`s3_output`); the s3_server fixture sets them.
S3_KEY_ENV, S3_SECRET_ENV = "TIDEMARK_TEST_S3_ACCESS_KEY", "TIDEMARK_TEST_S3_SECRET_KEY"


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """A private PostgreSQL cluster for the session (user postgres, trust authentication)."""
    server = LocalPostgres.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """A private Redis server for the session (Celery's broker)."""
    server = LocalRedis.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoS3]:
    """An S3 endpoint (moto's server) for the session; its keys exported as `S3_KEY_ENV` and
    `S3_SECRET_ENV` for the configs `s3_output` writes."""
    server = MotoS3.start()
    saved = {k: os.environ.get(k) for k in (S3_KEY_ENV, S3_SECRET_ENV)}
    os.environ[S3_KEY_ENV], os.environ[S3_SECRET_ENV] = S3_ACCESS_KEY, S3_SECRET_KEY
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: MotoS3, request: pytest.FixtureRequest) -> str:
    """A fresh bucket of `s3_server` for one test, named after it."""
    slug = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    return s3_server.create_bucket(f"t-{slug}-{uuid.uuid4().hex[:8]}")


def s3_output(server: MotoS3, bucket: str, **extra: Any) -> dict[str, Any]:
    """An ``output`` section with staging and lake in ``bucket`` of ``server``."""
    return {
        "path": f"s3://{bucket}/lake",
        "staging": f"s3a://{bucket}/staging",
        "s3": {
            "endpoint": server.endpoint,
            "region": "us-east-1",
            "path_style": True,
            "access_key_env": S3_KEY_ENV,
            "secret_key_env": S3_SECRET_ENV,
        },
        **extra,
    }


@pytest.fixture
def pg_state(postgres: LocalPostgres) -> Iterator[tuple[str, str]]:
    """A fresh PostgreSQL database for one test's state store and catalog: (SQLAlchemy URL,
    JDBC URL of the same database)."""
    import psycopg

    name = f"s3_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield (
        f"postgresql+psycopg://postgres@127.0.0.1:{postgres.port}/{name}",
        f"jdbc:postgresql://127.0.0.1:{postgres.port}/{name}",
    )
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
