"""One table's deterministic failure never blocks the others (issue 11, item 7).

Real causes on a private MariaDB and local Spark: a table the pipeline's user lost SELECT on
(preflight and plan), a table whose filter names a column the source lacks (the chunk read's
SQL error). The run publishes the other table, exits 1 with one line naming the failed
table, its reason and the fix, and `status` shows it; after the cause is fixed a plain rerun
publishes it equal to the source. And ``run --table T --snapshot`` while a killed run is
unfinished: T leaves that run (which resumes for the other table) and is snapshotted in a
run of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.cli import main
from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import PipelineConfig, load_config
from orchestrator.pipeline.context import open_store, table_dir
from tests.conftest import assert_lake_equals_source, fresh_database, pipeline_config, write_config
from tests.integration.conftest import before_first_pass
from tests.integration.test_resume import tidemark

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(40), n INT)"
FILL = "INSERT INTO {name} SELECT seq, CONCAT('row ', seq), seq % 97 FROM seq_1_to_{rows}"


def _setup(
    mariadb: LocalMariaDB, tmp_path: Path, db: str, tables: list[dict[str, Any]], **source: Any
) -> Path:
    fresh_database(mariadb, db)
    for name, rows in (("a", 3000), ("b", 2000)):
        mariadb.execute(TABLE.format(name=name), FILL.format(name=name, rows=rows), database=db)
    data = pipeline_config(
        tmp_path,
        mariadb,
        tables,
        name=db,
        defaults={"chunk_size": 1000, "batch_chunks": 2, "read_margin_seconds": 0.0},
    )
    data["source"].update(source)
    return write_config(tmp_path / "p.yaml", data)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("tidemark: error:")]


def _manifest(config: PipelineConfig, table: str) -> dict[str, Any]:
    return dict(
        json.loads((Path(table_dir(config, table)) / "_tidemark" / "current.json").read_text())
    )


def _change(mariadb: LocalMariaDB, db: str, salt: int) -> None:
    for name in ("a", "b"):
        mariadb.execute(
            f"UPDATE {name} SET n = n + {salt} WHERE id % 13 = 0",
            f"DELETE FROM {name} WHERE id % 17 = {salt % 17}",
            f"INSERT INTO {name} (id, v, n) VALUES ({9000 + salt}, 'late', {salt})",
            database=db,
        )


def test_a_table_that_lost_its_grant_fails_alone(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object, capsys: pytest.CaptureFixture[str]
) -> None:
    db = "tf_grant"
    path = _setup(
        mariadb,
        tmp_path,
        db,
        [{"name": f"{db}.a"}, {"name": f"{db}.b"}],
        user="tm_tf",
        password="tf-pass",
    )
    mariadb.execute(
        "DROP USER IF EXISTS 'tm_tf'@'%'",
        "CREATE USER 'tm_tf'@'%' IDENTIFIED BY 'tf-pass'",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'tm_tf'@'%'",
        f"GRANT SELECT ON {db}.a TO 'tm_tf'@'%'",
        f"GRANT SELECT ON {db}.b TO 'tm_tf'@'%'",
    )
    config = load_config(path)
    assert _cli(capsys, "run", "--config", str(path), "--no-progress")[0] == 0
    b_before = _manifest(config, f"{db}.b")

    mariadb.execute(f"REVOKE SELECT ON {db}.b FROM 'tm_tf'@'%'")
    _change(mariadb, db, 1)
    code, out, err = _cli(capsys, "run", "--config", str(path), "--no-progress")
    assert code == 1, err
    errors = _errors(err)
    assert len(errors) == 1, err
    assert f"{db}.b failed at plan: " in errors[0] and f"lacks SELECT on {db}.b" in errors[0], (
        errors
    )
    assert "`tidemark run` retries it" in errors[0] and f"{db}.a" not in errors[0], errors
    assert f"{db}.a" in out  # published, in the summary
    assert_lake_equals_source(config, mariadb, [f"{db}.a"])
    assert _manifest(config, f"{db}.b") == b_before  # untouched; its position not moved
    code, out, _ = _cli(capsys, "status", "--config", str(path))
    assert code == 0 and " partial " in out, out
    assert any(
        f"{db}.b" in line and "failed at plan: " in line and "lacks SELECT" in line
        for line in out.splitlines()
    ), out

    # Fixed at the source: a plain rerun retries b (from its own published position) and a goes on.
    mariadb.execute(f"GRANT SELECT ON {db}.b TO 'tm_tf'@'%'")
    _change(mariadb, db, 2)
    code, _, err = _cli(capsys, "run", "--config", str(path), "--no-progress")
    assert code == 0, err
    assert_lake_equals_source(config, mariadb, [f"{db}.a", f"{db}.b"])
    assert _manifest(config, f"{db}.b")["version"] == b_before["version"] + 1


def test_several_failed_tables_are_a_line_each(
    mariadb: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two tables failing on their own: a first line naming the run and both tables (what the
    Airflow task's record keeps), then one line for each, with its reason and its fix."""
    db = "tf_many"
    path = _setup(
        mariadb,
        tmp_path,
        db,
        [{"name": f"{db}.a", "where": "flag = 1"}, {"name": f"{db}.b", "where": "gone = 2"}],
    )
    code, _, err = _cli(capsys, "run", "--config", str(path), "--no-progress")
    assert code == 1, err
    errors = _errors(err)
    assert len(errors) == 3, err
    assert errors[0].endswith(f"published nothing: 2 table(s) failed ({db}.a, {db}.b):"), errors
    expected = ((f"{db}.a", "flag"), (f"{db}.b", "gone"))
    for line, (table, column) in zip(errors[1:], expected, strict=True):
        assert f"{table} failed at plan: " in line and f"has no column `{column}`" in line, line
        assert line.endswith("then `tidemark run` retries it"), line
    with open_store(load_config(path)) as store:  # the run's record: the first line, one line
        error = store.runs(f"{db}", limit=1)[0].error or ""
    assert error.endswith(f"2 table(s) failed ({db}.a, {db}.b)") and "\n" not in error, error


def test_a_filter_on_a_missing_column_fails_its_table_alone(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """The filter is bound to the table's columns when the run is planned (the binlog must
    evaluate it exactly), so a column it names that the table lacks fails that table at plan,
    before any read; the other table is read and published."""
    db = "tf_read"
    path = _setup(
        mariadb, tmp_path, db, [{"name": f"{db}.a"}, {"name": f"{db}.b", "where": "flag = 1"}]
    )
    config = load_config(path)
    code, _, err = _cli(capsys, "run", "--config", str(path), "--no-progress")
    assert code == 1, err
    errors = _errors(err)
    assert len(errors) == 1 and f"{db}.b failed at plan: " in errors[0], err
    assert "has no column `flag`" in errors[0], errors
    assert_lake_equals_source(config, mariadb, [f"{db}.a"])
    assert not (Path(table_dir(config, f"{db}.b")) / "_tidemark" / "current.json").exists()
    with open_store(config) as store:
        run = store.runs(config.pipeline, limit=1)[0]
        assert run.status == "partial" and f"{db}.b" in (run.error or "")
        failed = {
            r.table: r.info["failure"] for r in store.run_tables(run.run_id) if r.status == "failed"
        }
    assert list(failed) == [f"{db}.b"] and failed[f"{db}.b"]["step"] == "plan"

    # The column the filter needs is added at the source; the rerun snapshots b, a goes on.
    mariadb.execute("ALTER TABLE b ADD COLUMN flag INT NOT NULL DEFAULT 1", database=db)
    _change(mariadb, db, 3)
    code, _, err = _cli(capsys, "run", "--config", str(path), "--no-progress")
    assert code == 0, err
    assert_lake_equals_source(config, mariadb, [f"{db}.a", f"{db}.b"])


def test_snapshot_of_one_table_while_the_run_is_unfinished(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object, capsys: pytest.CaptureFixture[str]
) -> None:
    db = "tf_fresh"
    path = _setup(mariadb, tmp_path, db, [{"name": f"{db}.a"}, {"name": f"{db}.b"}])
    config = load_config(path)
    killed = tidemark(path, failpoint="read.batch_done:1")  # a's first batch read, then killed
    assert killed.returncode != 0
    with open_store(config) as store:
        unfinished = store.runs(config.pipeline, limit=1)[0]
    _change(mariadb, db, 4)
    code, out, err = _cli(
        capsys, "run", "--config", str(path), "--no-progress", "--table", f"{db}.b", "--snapshot"
    )
    assert code == 0, err
    assert f"resumes without {db}.b" in out, out  # a notice: stdout (stderr holds only failures)
    assert_lake_equals_source(config, mariadb, [f"{db}.a", f"{db}.b"])
    assert _manifest(config, f"{db}.a")["run_id"] == unfinished.run_id  # a: the resumed run
    assert _manifest(config, f"{db}.b")["run_id"] != unfinished.run_id  # b: a run of its own
    _change(mariadb, db, 5)
    assert _cli(capsys, "run", "--config", str(path), "--no-progress")[0] == 0
    assert_lake_equals_source(config, mariadb, [f"{db}.a", f"{db}.b"])


def test_reset_of_one_table_while_the_run_is_unfinished(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object, capsys: pytest.CaptureFixture[str]
) -> None:
    db = "tf_reset"
    path = _setup(mariadb, tmp_path, db, [{"name": f"{db}.a"}, {"name": f"{db}.b"}])
    config = load_config(path)
    assert _cli(capsys, "run", "--config", str(path), "--no-progress")[0] == 0
    _change(mariadb, db, 6)
    # Killed after a was reconciled at the run's H: its capture is done, b's too.
    killed = tidemark(path, failpoint="reconcile.table_done:1")
    assert killed.returncode != 0
    # Changes after that H: a must get them from the next run, not lose them because b's
    # re-planning moves the run's H on.
    _change(mariadb, db, 7)
    code, _, err = _cli(capsys, "reset", "--config", str(path), "--table", f"{db}.b", "--yes")
    assert code == 0, err
    code, out, err = _cli(
        capsys, "run", "--config", str(path), "--no-progress"
    )  # resumes; b afresh
    assert code == 0, err
    assert "resuming unfinished run" in out, out
    assert_lake_equals_source(config, mariadb, [f"{db}.b"])
    assert _cli(capsys, "run", "--config", str(path), "--no-progress")[0] == 0
    assert_lake_equals_source(config, mariadb, [f"{db}.a", f"{db}.b"])


def _reserved_fails_alone(
    config: PipelineConfig, mariadb: LocalMariaDB, db: str, err: str, column: str
) -> None:
    """One error line, for b: the column, the reserved prefix, the fix; a is published."""
    errors = _errors(err)
    assert len(errors) == 1 and f"{db}.b failed at plan: " in errors[0], err
    assert f"column `{column}` is named like Tidemark's own change columns" in errors[0], errors
    assert (
        f"rename it at the source (ALTER TABLE {db}.b RENAME COLUMN `{column}` TO ...)" in errors[0]
    )
    assert_lake_equals_source(config, mariadb, [f"{db}.a"])


def test_a_column_named_like_tidemarks_own_fails_its_table_alone(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source column named like a change segment's (``_tm_op``) made every run with a change of
    that table fail at reconcile. Preflight now fails that table alone, naming the column; doctor
    too. Renamed at the source, the next run re-reads it."""
    db = "tf_tmcol"
    path = _setup(mariadb, tmp_path, db, [{"name": f"{db}.a"}, {"name": f"{db}.b"}])
    config = load_config(path)
    assert _cli(capsys, "run", "--config", str(path), "--no-progress")[0] == 0
    b_before = _manifest(config, f"{db}.b")
    mariadb.execute("ALTER TABLE b ADD COLUMN _tm_op CHAR(1) NOT NULL DEFAULT 'x'", database=db)
    _change(mariadb, db, 8)
    code, _, err = _cli(capsys, "run", "--config", str(path), "--no-progress")
    assert code == 1, err
    _reserved_fails_alone(config, mariadb, db, err, "_tm_op")
    assert _manifest(config, f"{db}.b") == b_before
    code, out, _ = _cli(capsys, "doctor", "--config", str(path))
    assert code == 3 and f"FAIL  column names {db}.b: table {db}.b: column `_tm_op`" in out, out

    mariadb.execute("ALTER TABLE b RENAME COLUMN _tm_op TO op", database=db)
    _change(mariadb, db, 9)
    assert _cli(capsys, "run", "--config", str(path), "--no-progress")[0] == 0
    assert_lake_equals_source(config, mariadb, [f"{db}.a", f"{db}.b"])


def test_a_column_named_like_tidemarks_own_added_during_the_run(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    spark: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Added by DDL after preflight, seen by the capture: the re-read's planning fails b alone."""
    db = "tf_tmcol_run"
    path = _setup(mariadb, tmp_path, db, [{"name": f"{db}.a"}, {"name": f"{db}.b"}])
    config = load_config(path)
    assert _cli(capsys, "run", "--config", str(path), "--no-progress")[0] == 0
    _change(mariadb, db, 10)
    calls = before_first_pass(
        monkeypatch,
        mariadb,
        db,
        "ALTER TABLE b ADD COLUMN _TM_Pos INT",
        "UPDATE b SET _TM_Pos = 1 WHERE id < 9",
    )
    code, _, err = _cli(capsys, "run", "--config", str(path), "--no-progress")
    assert code == 1, err
    _reserved_fails_alone(config, mariadb, db, err, "_TM_Pos")
    assert len(calls) == 2 and "(re-read after DDL `ALTER TABLE b ADD COLUMN _TM_Pos" in err, err
