"""A state store, and the Iceberg catalog in its database, reached through PgBouncer in
transaction mode (what Airflow's Helm chart puts before its database, and many DBAs before
theirs): a client's transactions run on whichever server connection is free.

psycopg 3 prepares a statement on the server at its fifth run on a connection; the pooler's next
transaction then ran elsewhere, and every run failed with 'prepared statement "_pg3_2" does not
exist' (or "already exists": another client's). The DAG file's peek at the table set named a
``statement_timeout`` in the connection's startup ``options``, which PgBouncer refuses: the
trigger form of every such pipeline offered its config entries only."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import load_config
from orchestrator.state import many
from orchestrator.state.records import TableSetRecord
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, fresh_database, pipeline_config, write_config
from tests.services import LocalPgBouncer, LocalPostgres

pytestmark = [pytest.mark.integration]

DB = "tm_pooled"


@pytest.fixture
def database(postgres: LocalPostgres) -> Iterator[str]:
    """A fresh database of the session's PostgreSQL."""
    name = f"pooled_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pooled(postgres: LocalPostgres, database: str) -> Iterator[LocalPgBouncer]:
    bouncer = LocalPgBouncer.start(postgres, database)
    yield bouncer
    bouncer.stop()


def test_a_state_store_behind_pgbouncer_in_transaction_mode_serves_every_run(
    mariadb: LocalMariaDB, pooled: LocalPgBouncer, tmp_path: Path
) -> None:
    """A snapshot of six tables (a pattern) and three rounds of changes, each applied by a run
    whose state store and catalog are through the pooler: each run exits 0 and publishes the
    tables equal to the source; the DAG file's peek finds the pattern's tables."""
    tables = [f"{DB}.t{i}" for i in range(6)]
    fresh_database(
        mariadb,
        DB,
        *(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)" for t in tables),
        *(f"INSERT INTO {t} SELECT seq, seq FROM seq_1_to_3000" for t in tables),
    )
    config = load_config(
        write_config(
            tmp_path / "p.yaml",
            pipeline_config(
                tmp_path,
                mariadb,
                [{"name": f"{DB}.*"}],
                name="pooled",
                state={"url": pooled.url},
                defaults={"read_margin_seconds": 0.0},
            ),
        )
    )
    for change in range(4):
        if change:
            mariadb.execute(
                *(f"UPDATE {t} SET v = v + 1 WHERE id % 7 = {change}" for t in tables),
                *(f"DELETE FROM {t} WHERE id = {change * 100}" for t in tables),
            )
        code = run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False)
        assert code == 0, f"run {change}"
        assert_lake_equals_source(config, mariadb, tables)
    found = many.peek_table_set(pooled.url, "pooled")
    assert found is not None and sorted(found.patterns[0]["tables"]) == tables


def test_a_peek_at_a_locked_state_store_gives_up(
    postgres: LocalPostgres, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peek's ``statement_timeout``, now set in its own transaction: a table set locked by
    another session (a migration, say) gives None, with the DAG file parsed on, rather than a
    parse that waits for the lock; unlocked, the peek finds it."""
    unanswered: dict[str, float] = {}
    monkeypatch.setattr(many, "_UNANSWERED", unanswered)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{postgres.port}/{database}"
    with StateStore(url) as store:
        store.save_table_set(
            "locked", "r1", [{"pattern": "a.*", "index": 0, "tables": ["a.b"]}], []
        )
    with psycopg.connect(postgres.admin_dsn.replace("dbname=postgres", f"dbname={database}")) as c:
        c.execute("LOCK TABLE tm_table_sets IN ACCESS EXCLUSIVE MODE")
        found: list[TableSetRecord | None] = []
        peek = threading.Thread(target=lambda: found.append(many.peek_table_set(url, "locked")))
        peek.start()
        peek.join(timeout=60)
        assert not peek.is_alive(), "the peek waits for the lock"
    assert found == [None] and unanswered
    unanswered.clear()  # asked again at once, not after PEEK_RETRY_SECONDS
    unlocked = many.peek_table_set(url, "locked")
    assert unlocked is not None and unlocked.run_id == "r1"
