"""Fixtures of the state store tests (test_state.py, test_lease.py): a fresh store on a real
SQLite file and on a real PostgreSQL (the session's private cluster, the `postgres` fixture of
tests/conftest.py). The PostgreSQL URL carries a password (trust auth ignores it) so the tests can
check it never shows."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from orchestrator.state.store import StateStore
from tests.services import LocalPostgres

PG_SECRET = "pg-secret-must-not-show"


@pytest.fixture(scope="session")
def pg_database(postgres: LocalPostgres) -> Iterator[str]:
    """A database of our own on the session's PostgreSQL, dropped at the end of the session."""
    import psycopg

    admin = psycopg.connect(postgres.admin_dsn, autocommit=True)
    name = f"tidemark_state_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL to an empty store: a SQLite file in a directory that does not exist yet, a fresh
    PostgreSQL schema (through ``search_path``) in the session's database, or a fresh database
    of the session's MariaDB."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'state.db'}"
    if request.param == "mariadb":
        server = request.getfixturevalue("mariadb")
        name = f"tm_state_{uuid.uuid4().hex[:12]}"
        server.execute(f"CREATE DATABASE {name}")
        return f"mysql+pymysql://root@127.0.0.1:{server.port}/{name}"
    import psycopg

    database = request.getfixturevalue("pg_database")
    port = request.getfixturevalue("postgres").port
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = f"host=127.0.0.1 port={port} user=postgres dbname={database} connect_timeout=5"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return (
        f"postgresql+psycopg://postgres:{PG_SECRET}@127.0.0.1:{port}/{database}"
        f"?options=-csearch_path%3D{schema}"
    )


@pytest.fixture
def store(url: str) -> Iterator[StateStore]:
    with StateStore(url) as opened:
        yield opened


def run_sql(url: str, statement: Any, params: dict[str, Any] | None = None) -> Any:
    """Execute one statement on the store's database, outside StateStore; returns all rows."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.execute(statement, params or {})
            return result.all() if result.returns_rows else None
    finally:
        engine.dispose()
