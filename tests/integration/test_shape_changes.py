"""Changes of shape the column types alone do not show - ENUM labels appended or reordered,
two columns of one type swapped, a charset conversion - between runs and during a snapshot:
after plain ``tidemark run``s the lake equals the source and the log names the re-read.

(The reader-level check of each TABLE_MAP's metadata, with the ALTER outside the range read,
is `tests/integration/test_binlog.py::test_table_map_metadata_differences_are_table_changes`.)
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import PipelineConfig
from tests.conftest import assert_lake_equals_source
from tests.integration.conftest import before_first_pass, run_plain, two_table_pipeline

pytestmark = pytest.mark.integration

TABLE = (
    "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, e ENUM('a','b','c'), f INT, g INT,"
    " v VARCHAR(40) CHARACTER SET latin1)"
)
FILL = (
    "INSERT INTO {db}.{name} SELECT seq, ELT(1 + seq % 3, 'a', 'b', 'c'), seq, -seq,"
    " CONCAT('row ', seq) FROM seq_1_to_{rows}"
)

#: case: (the ALTER, changes after it)
CHANGES: dict[str, tuple[str, list[str]]] = {
    "enum_append": (
        "ALTER TABLE t MODIFY e ENUM('a','b','c','d')",
        ["UPDATE t SET e = 'd' WHERE id % 10 = 0", "INSERT INTO t VALUES (9001, 'd', 1, 2, 'x')"],
    ),
    "enum_reorder": (
        "ALTER TABLE t MODIFY e ENUM('c','b','a')",
        ["UPDATE t SET e = 'a' WHERE id % 7 = 0", "INSERT INTO t VALUES (9001, 'c', 1, 2, 'x')"],
    ),
    "swap": (
        "ALTER TABLE t RENAME COLUMN f TO g, RENAME COLUMN g TO f",
        ["UPDATE t SET f = f + 1 WHERE id % 9 = 0", "INSERT INTO t VALUES (9001, 'a', 1, 2, 'x')"],
    ),
    "charset": (
        "ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4",
        [
            "UPDATE t SET v = 'é 🌊' WHERE id % 11 = 0",
            "INSERT INTO t VALUES (9001, 'a', 1, 2, '🌊')",
        ],
    ),
}


def _setup(mariadb: LocalMariaDB, tmp_path: Path, db: str) -> PipelineConfig:
    return two_table_pipeline(mariadb, tmp_path, db, TABLE, FILL, (3000, 1000))


def _run(config: PipelineConfig) -> None:
    run_plain(config)


@pytest.mark.parametrize("case", list(CHANGES))
def test_between_runs(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    db = f"shape_{case}"
    config = _setup(mariadb, tmp_path, db)
    _run(config)
    alter, after = CHANGES[case]
    mariadb.execute("UPDATE t SET f = f * 2 WHERE id < 50", alter, *after, database=db)
    mariadb.execute(f"INSERT INTO {db}.other VALUES (5000, 'b', 1, 1, 'o')")
    caplog.set_level(logging.INFO)
    caplog.clear()
    _run(config)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().endswith("re-read")]
    assert any(line.startswith(f"table {db}.t: ") for line in lines), lines
    assert not any(line.startswith(f"table {db}.other: ") for line in lines), lines
    if case == "charset":  # the column types are the same: the capture sees the change, first
        # in the TABLE_MAP of the UPDATE before the ALTER (its rows are of the old charset)
        assert any(
            line.startswith(
                f"table {db}.t: a TABLE_MAP of another shape (column `v` has "
                "collation id 8 in the binlog but utf8mb4_general_ci as "
                "planned) at binlog."
            )
            for line in lines
        ), lines
    _run(config)  # and nothing more happens
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])


@pytest.mark.parametrize("case", list(CHANGES))
def test_during_a_snapshot(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    """The ALTER between the read step and ``H``: the table is re-read inside the run."""
    db = f"shape_mid_{case}"
    config = _setup(mariadb, tmp_path, db)
    alter, after = CHANGES[case]
    calls = before_first_pass(
        monkeypatch, mariadb, db, "UPDATE t SET f = f * 2 WHERE id < 50", alter, *after
    )
    caplog.set_level(logging.INFO)
    _run(config)
    assert len(calls) == 2
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().endswith(": re-read")]
    # (sqlglot parses no CONVERT TO CHARACTER SET: "an unparsed statement", re-read the same)
    assert any(
        line.startswith(
            (
                f"table {db}.t: DDL `ALTER TABLE t ",
                f"table {db}.t: an unparsed statement `ALTER TABLE t ",
            )
        )
        and " at binlog." in line
        for line in lines
    ), lines


#: DDLs that fail a read planned before them: a column it selects dropped, or renamed.
DURING_READ = {
    "drop": "ALTER TABLE {name} DROP COLUMN g",
    "rename": "ALTER TABLE {name} RENAME COLUMN f TO f2",
}


@pytest.mark.parametrize("case", list(DURING_READ))
@pytest.mark.parametrize("table", ["t", "other"], ids=["spark", "driver"])
def test_during_the_read(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    table: str,
) -> None:
    """A column dropped or renamed after the plan, before the table's chunks are read (by Spark:
    ``t``'s three chunks; by the driver: ``other``'s one): its read fails ("Unknown column"), and
    the table is re-read inside the run with its new columns. Before, the run ended partial with
    that table failed at read until the next run."""
    from orchestrator.pipeline.read import step as read_module

    db = f"shape_read_{case}_{table}"
    config = _setup(mariadb, tmp_path, db)
    real = read_module._read_tables
    lock, calls = threading.Lock(), []

    def alter_first(*args: Any, **kwargs: Any) -> Any:
        with lock:  # batches are read side by side
            if not calls:  # the plan is made, no chunk is read yet
                mariadb.execute(DURING_READ[case].format(name=table), database=db)
                mariadb.execute(f"UPDATE {table} SET e = 'c' WHERE id < 20", database=db)
            calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(read_module, "_read_tables", alter_first)
    caplog.set_level(logging.INFO)
    _run(config)
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().endswith("; re-read")]
    assert any(
        line.startswith(f"table {db}.{table}: its read failed (") and "after a DDL" in line
        for line in lines
    ), lines


#: ALTERs after preflight: one that no row event after it shows, and one that rows after it do.
AFTER_PREFLIGHT = {"add": ("ALTER TABLE t ADD COLUMN x INT NOT NULL DEFAULT 7", []), **CHANGES}


@pytest.mark.parametrize("case", ["add", "swap"])
@pytest.mark.parametrize("first", [True, False], ids=["snapshot", "incremental"])
def test_after_preflight(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    first: bool,
) -> None:
    """The ALTER after preflight read the shapes, before the plan: the plan reads no shape of its
    own (it takes preflight's), and its ``P0`` is the position preflight read them after, so the
    binlog the run applies holds the ALTER (``add``: nothing else shows it)."""
    from orchestrator.app import steps
    from orchestrator.pipeline.plan import tables as plan_module

    db = f"shape_pre_{case}_{int(first)}"
    config = _setup(mariadb, tmp_path, db)
    if not first:
        _run(config)
    alter, after = AFTER_PREFLIGHT[case]
    real_plan, real_read = steps.plan, plan_module.tables_info
    read: list[str] = []

    def alter_first(*args: Any, **kwargs: Any) -> Any:
        assert kwargs["shapes"] is not None
        mariadb.execute("UPDATE t SET f = f * 2 WHERE id < 50", alter, *after, database=db)
        return real_plan(*args, **kwargs)

    def counted(source: Any, names: list[str]) -> Any:
        read.extend(names)
        return real_read(source, names)

    monkeypatch.setattr(steps, "plan", alter_first)
    monkeypatch.setattr(plan_module, "tables_info", counted)
    _run(config)
    assert read == []
    assert_lake_equals_source(config, mariadb, [f"{db}.t", f"{db}.other"])
