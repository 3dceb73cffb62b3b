"""Table patterns across plain `tidemark run`s (issue 16): a pattern with an exclude and an entry
overriding it; a matched table without any key published as the multiset of its rows, one whose
unique key must be chosen (no primary key) failing alone; a table created between runs
snapshotted while the others stay incremental; a dropped table reported and kept as last
published. Real MariaDB, local Spark; every published table compared with its source row for row."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.doctor import run_checks
from orchestrator.app.plan import plan_command
from orchestrator.app.run import run_command
from orchestrator.app.status import status_command, status_report
from orchestrator.config import PipelineConfig
from orchestrator.errors import ConfigError
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import open_store, table_dir
from orchestrator.pipeline.failed import TablesFailed
from tests.conftest import assert_lake_equals_source, load_pipeline

pytestmark = pytest.mark.integration

DB = "pat_crm"


def run(config: PipelineConfig) -> None:
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0


def latest_modes(config: PipelineConfig) -> dict[str, str]:
    """Table -> mode (snapshot or incremental) in the pipeline's latest run."""
    store = open_store(config)
    try:
        run_id = store.runs(config.pipeline, limit=1)[0].run_id
        return {r.table: r.mode for r in store.run_tables(run_id)}
    finally:
        store.close()


def test_a_pattern_follows_the_tables_of_the_source(
    mariadb: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mariadb.execute(f"CREATE DATABASE {DB}")
    mariadb.execute(
        "CREATE TABLE accounts (id INT PRIMARY KEY, v VARCHAR(20))",
        "CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(10, 2))",
        "CREATE TABLE tmp_scratch (id INT PRIMARY KEY)",
        "CREATE TABLE nopk (id INT NOT NULL, b INT, UNIQUE KEY (id))",
        "CREATE TABLE heap (id INT, b INT)",
        "CREATE TABLE big (id INT PRIMARY KEY, n INT)",
        "INSERT INTO accounts SELECT seq, CONCAT('a', seq) FROM seq_1_to_100",
        "INSERT INTO orders SELECT seq, seq * 1.5 FROM seq_1_to_100",
        "INSERT INTO tmp_scratch SELECT seq FROM seq_1_to_10",
        "INSERT INTO nopk SELECT seq, seq FROM seq_1_to_10",
        "INSERT INTO heap SELECT seq % 90, 1 FROM seq_1_to_200",
        "INSERT INTO big SELECT seq, seq FROM seq_1_to_200",
        database=DB,
    )
    entries = [
        {"name": f"{DB}.*", "exclude": [f"{DB}.tmp_*"], "where": "id <= 80"},
        {"name": f"{DB}.big", "chunk_size": 20},
    ]  # its own entry: no filter, small chunks
    config = load_pipeline(tmp_path, mariadb, entries, name="patterns")
    accounts, orders, big, fresh, heap = (
        f"{DB}.{t}" for t in ("accounts", "orders", "big", "fresh", "heap")
    )

    # doctor shows what the pattern matched; the table whose unique key must be chosen fails
    # alone, naming the exclude; the table without any key is published as a multiset
    checks = {c.name: c for c in run_checks(config)}
    assert checks[f"pattern {DB}.*"].detail == (
        f"{DB}.* matches 4 table(s): {accounts}, {heap}, {DB}.nopk, {orders}; "
        f"excluded: {DB}.tmp_scratch; "
        f"configured by their own entry: {big}"
    )
    assert not checks[f"chunk key {DB}.nopk"].ok
    assert "or add it to tables[0].exclude" in checks[f"chunk key {DB}.nopk"].fix
    assert all(c.ok for name, c in checks.items() if "nopk" not in name)
    # plan: the others are planned, the table without a key is listed, exit 3
    capsys.readouterr()
    assert plan_command(config, [f"{DB}.*"], as_json=True) == 3
    document = json.loads(capsys.readouterr().out)
    assert [t["table"] for t in document["tables"]] == [
        accounts,
        heap,
        orders,
    ]  # the pattern's own tables
    assert [f["table"] for f in document["failed"]] == [f"{DB}.nopk"]
    assert document["patterns"][0]["excluded"] == [f"{DB}.tmp_scratch"]

    # run 1: the others are published; the pattern's filter applies to its tables, not to big
    with pytest.raises(TablesFailed) as partial:
        run(config)
    assert list(partial.value.failed) == [f"{DB}.nopk"]
    assert_lake_equals_source(config, mariadb, [accounts, orders, big, heap])
    assert read_manifest(table_dir(config, accounts))["rows"] == 80
    assert read_manifest(table_dir(config, big))["rows"] == 200
    assert not Path(table_dir(config, f"{DB}.tmp_scratch")).exists()

    # run 2: a table created since is snapshotted; the others are caught up from the binlog
    mariadb.execute(
        "DROP TABLE nopk",
        "CREATE TABLE fresh (id INT PRIMARY KEY, v VARCHAR(20))",
        "INSERT INTO fresh SELECT seq, 'f' FROM seq_1_to_50",
        "UPDATE accounts SET v = 'changed' WHERE id BETWEEN 10 AND 20",
        "UPDATE accounts SET id = id + 1000 WHERE id = 5",  # leaves the filter
        "DELETE FROM big WHERE id > 190",
        "DELETE FROM heap WHERE id = 3 LIMIT 1",
        "UPDATE heap SET id = 85 WHERE id = 4 LIMIT 1",  # leaves the filter
        database=DB,
    )
    run(config)
    assert latest_modes(config) == {
        accounts: "incremental",
        orders: "incremental",
        big: "incremental",
        fresh: "snapshot",
        heap: "incremental",
    }
    assert_lake_equals_source(config, mariadb, [accounts, orders, big, fresh, heap])
    orders_version = read_manifest(table_dir(config, orders))

    # run 3: a dropped table is reported and kept in the lake as last published
    mariadb.execute("DROP TABLE orders", "INSERT INTO fresh VALUES (51, 'g')", database=DB)
    capsys.readouterr()
    run(config)
    out = capsys.readouterr().out
    assert f"dropped at the source, kept in the lake as last published: {orders}" in out
    assert orders not in latest_modes(config)
    assert read_manifest(table_dir(config, orders)) == orders_version
    assert_lake_equals_source(config, mariadb, [accounts, big, fresh])
    assert status_command(config) == 0
    status = capsys.readouterr().out
    assert f"pattern {DB}.* matches 3 table(s): {accounts}, {fresh}, {heap}" in status
    line = next(
        x for x in status.split("published:", 1)[1].splitlines() if x.strip().startswith(orders)
    )
    assert "dropped at the source: kept as last published" in line
    report = status_report(config)  # status --json
    assert report["patterns"][0]["tables"] == [accounts, fresh, heap]
    assert [p["table"] for p in report["published"] if p["dropped_at_source"]] == [orders]


def test_a_pattern_takes_a_system_versioned_table_unless_versioned_by_transaction_ids(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A table versioned by timestamps is applied from the binlog as its current rows, so a
    pattern takes it, its period columns declared or not; one versioned by transaction ids is
    logged as statements (each change re-reads it whole), so it is named or left out."""
    db = "pat_versioned"
    mariadb.execute(f"CREATE DATABASE {db}")
    tables = {
        "plain": "CREATE TABLE plain (id INT PRIMARY KEY, v INT)",
        "implicit": "CREATE TABLE implicit (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
        "declared": "CREATE TABLE declared (id INT PRIMARY KEY, v INT,"
        " rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START INVISIBLE,"
        " re TIMESTAMP(6) GENERATED ALWAYS AS ROW END INVISIBLE,"
        " PERIOD FOR SYSTEM_TIME(rs, re)) WITH SYSTEM VERSIONING",
        "trx": "CREATE TABLE trx (id INT PRIMARY KEY, v INT,"
        " rs BIGINT UNSIGNED GENERATED ALWAYS AS ROW START INVISIBLE,"
        " re BIGINT UNSIGNED GENERATED ALWAYS AS ROW END INVISIBLE,"
        " PERIOD FOR SYSTEM_TIME(rs, re)) ENGINE=InnoDB WITH SYSTEM VERSIONING",
    }
    mariadb.execute(
        *tables.values(),
        *(f"INSERT INTO {t} (id, v) SELECT seq, seq FROM seq_1_to_50" for t in tables),
        database=db,
    )
    config = load_pipeline(tmp_path, mariadb, [{"name": f"{db}.*"}], name="versioned")
    taken = [f"{db}.{t}" for t in ("declared", "implicit", "plain")]
    checks = {c.name: c for c in run_checks(config)}
    assert checks[f"pattern {db}.*"].detail.startswith(
        f"{db}.* matches 3 table(s): {', '.join(taken)}"
    ), checks[f"pattern {db}.*"].detail
    run(config)
    assert_lake_equals_source(config, mariadb, taken)

    mariadb.execute(
        *(f"UPDATE {t} SET v = v + 100 WHERE id <= 10" for t in tables),
        *(f"DELETE FROM {t} WHERE id > 45" for t in tables),
        *(f"INSERT INTO {t} (id, v) VALUES (60, 60)" for t in tables),
        database=db,
    )
    run(config)
    assert latest_modes(config) == dict.fromkeys(taken, "incremental")
    assert_lake_equals_source(config, mariadb, taken)
    assert read_manifest(table_dir(config, f"{db}.implicit"))["rows"] == 46
    assert not Path(table_dir(config, f"{db}.trx")).exists()


def test_names_outside_letters_and_digits_are_taken_by_name_and_unsafe_ones_by_nothing(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database and tables whose names have a hyphen, a space, a dot or letters outside ASCII,
    which the server takes, can be named in the config, and so can a ``chunk_key`` of columns
    with spaces (validate refused every name outside ``[A-Za-z0-9_$]``, while a glob took
    them): a snapshot and a change. A table named `..`
    (or `.`, or with a `/`) would be the lake's root, or a directory inside another table's:
    naming it is refused, and a pattern leaves it out, saying so."""
    db = "tm-odd names"
    mariadb.execute(f"DROP DATABASE IF EXISTS `{db}`", f"CREATE DATABASE `{db}`")
    try:
        mariadb.execute(
            "CREATE TABLE `order-items` (id INT PRIMARY KEY, v INT)",
            "INSERT INTO `order-items` SELECT seq, seq FROM seq_1_to_50",
            "CREATE TABLE `my table.v2` (id INT PRIMARY KEY, v VARCHAR(5))",
            "INSERT INTO `my table.v2` VALUES (1, 'a'), (2, 'b')",
            "CREATE TABLE `Ünïcode` (id INT PRIMARY KEY)",
            "INSERT INTO `Ünïcode` VALUES (1)",
            "CREATE TABLE `line items` (`order id` INT NOT NULL, `line no` INT NOT NULL, v INT,"
            " UNIQUE KEY (`order id`, `line no`))",
            "INSERT INTO `line items` SELECT seq % 7, seq, seq FROM seq_1_to_30",
            "CREATE TABLE `..` (id INT PRIMARY KEY)",
            "CREATE TABLE `a/b` (id INT PRIMARY KEY)",
            database=db,
        )
        named = [f"{db}.order-items", f"{db}.my table.v2", f"{db}.Ünïcode", f"{db}.line items"]
        entries: list[dict[str, object]] = [{"name": n} for n in named[:3]]
        entries.append({"name": named[3], "chunk_key": ["order id", "line no"]})
        config = load_pipeline(tmp_path, mariadb, entries, name="odd")
        run(config)
        mariadb.execute(
            "UPDATE `order-items` SET v = -v WHERE id < 10",
            "DELETE FROM `my table.v2` WHERE id = 1",
            "INSERT INTO `Ünïcode` VALUES (2)",
            "UPDATE `line items` SET v = 0 WHERE `line no` < 5",
            database=db,
        )
        run(config)
        assert_lake_equals_source(config, mariadb, named)
        assert (tmp_path / "lake" / db / "my table.v2" / "_tidemark" / "current.json").is_file()

        (tmp_path / "bad").mkdir()
        (tmp_path / "glob").mkdir()
        with pytest.raises(ConfigError) as refused:
            load_pipeline(tmp_path / "bad", mariadb, [{"name": f"{db}..."}], name="bad")
        assert f"table `{db}...`: `..` cannot be a directory of the lake" in str(refused.value)
        pattern = load_pipeline(
            tmp_path / "glob",
            mariadb,
            [{"name": "tm-odd*.*", "exclude": ["*.line items"]}],
            name="glob",
        )
        with caplog.at_level(logging.WARNING, logger="tidemark.planning"):
            run(pattern)
        assert caplog.text.count(f"patterns leave out `{db}.a/b`, `{db}...`: a name") == 1
        assert_lake_equals_source(pattern, mariadb, named[:3])
        assert not (tmp_path / "glob" / "lake" / db / "a").exists()
    finally:
        mariadb.execute(f"DROP DATABASE `{db}`")
