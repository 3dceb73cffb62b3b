"""Tables whose rows are not what the binlog logs under their name (docs/limits.md, "Tables the
binlog does not keep"): a view, a sequence, a MERGE, a BLACKHOLE and a FEDERATED table. Each
published a wrong table with exit 0 before: the view and the MERGE table stale, the
FEDERATED table missing its remote rows, the BLACKHOLE table holding rows it never keeps, the
sequence one row more at each change. Now each one named fails its checks with why, the run
publishing the other tables; a pattern takes none of them. Real MariaDB and its own plugins."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.doctor import run_checks
from orchestrator.app.run import run_command
from orchestrator.config import PipelineConfig
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.failed import TablesFailed
from tests.conftest import assert_lake_equals_source, load_pipeline
from tests.integration.conftest import before_first_pass, run_plain, two_table_pipeline

pytestmark = pytest.mark.integration

DB = "tm_unkept"

#: Each table the binlog cannot keep, and the words its check fails with.
UNKEPT = {
    "v": "is a VIEW",
    "s": "is a SEQUENCE",
    "m": "is a MRG_MYISAM table",
    "hole": "is a BLACKHOLE table",
    "fed": "is a FEDERATED table",
}


def _plugin(server: LocalMariaDB, library: str, name: str) -> None:
    found = server.execute(
        f"SELECT 1 FROM information_schema.PLUGINS WHERE PLUGIN_NAME = '{name}'"
        " AND PLUGIN_STATUS = 'ACTIVE'"
    )
    if not found:
        server.execute(f"INSTALL SONAME '{library}'")


@pytest.fixture
def unkept(mariadb: LocalMariaDB) -> LocalMariaDB:
    _plugin(mariadb, "ha_blackhole", "BLACKHOLE")
    _plugin(mariadb, "ha_federatedx", "FEDERATED")
    mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    mariadb.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
        "INSERT INTO t VALUES (1, 1), (2, 2)",
        "CREATE VIEW v AS SELECT id, v FROM t WHERE v > 0",
        "CREATE SEQUENCE s START WITH 10 INCREMENT BY 5 CACHE 2",
        "CREATE TABLE a (id INT NOT NULL, KEY (id)) ENGINE=MyISAM",
        "INSERT INTO a VALUES (1)",
        "CREATE TABLE m (id INT NOT NULL, KEY (id)) ENGINE=MERGE UNION=(a) INSERT_METHOD=LAST",
        "CREATE TABLE hole (id INT PRIMARY KEY, v INT) ENGINE=BLACKHOLE",
        "CREATE TABLE fed (id INT PRIMARY KEY, v INT) ENGINE=FEDERATED"
        f" CONNECTION='mysql://root@127.0.0.1:{mariadb.port}/{DB}/t'",
        database=DB,
    )
    return mariadb


def run(config: PipelineConfig) -> int:
    return run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False)


def test_a_table_the_binlog_does_not_keep_fails_alone_saying_why(
    unkept: LocalMariaDB, tmp_path: Path
) -> None:
    names = ["t", *UNKEPT]
    config = load_pipeline(tmp_path, unkept, [{"name": f"{DB}.{n}"} for n in names])
    checks = {c.name: c for c in run_checks(config)}
    for name, words in UNKEPT.items():
        check = checks[f"table {DB}.{name}"]
        assert not check.ok and words in check.detail, check.line()
        assert "leave it out of the pipeline" in check.fix
    assert checks[f"table {DB}.t"].ok

    with pytest.raises(TablesFailed) as partial:
        run(config)
    assert sorted(partial.value.failed) == sorted(f"{DB}.{n}" for n in UNKEPT)
    assert_lake_equals_source(config, unkept, [f"{DB}.t"])
    # what each of them published before: a stale or wrong table; now nothing, and again
    unkept.execute(
        "INSERT INTO t VALUES (3, 3)",
        "INSERT INTO a VALUES (2)",
        "INSERT INTO hole VALUES (1, 1)",
        "SELECT NEXTVAL(s)",
        "SELECT NEXTVAL(s)",
        "SELECT NEXTVAL(s)",
        database=DB,
    )
    with pytest.raises(TablesFailed) as again:
        run(config)
    assert sorted(again.value.failed) == sorted(partial.value.failed)
    assert_lake_equals_source(config, unkept, [f"{DB}.t"])
    for name in UNKEPT:
        assert not (Path(config.output.path) / DB / name).exists()


def test_a_pattern_takes_none_of_them(unkept: LocalMariaDB, tmp_path: Path) -> None:
    config = load_pipeline(tmp_path, unkept, [{"name": f"{DB}.*"}])
    checks = {c.name: c for c in run_checks(config)}
    assert checks[f"pattern {DB}.*"].detail.startswith(
        f"{DB}.* matches 2 table(s): {DB}.a, {DB}.t"
    ), checks[f"pattern {DB}.*"].detail
    assert run(config) == 0
    assert_lake_equals_source(config, unkept, [f"{DB}.a", f"{DB}.t"])


def test_a_table_made_blackhole_during_a_run_fails_at_its_re_read(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ALTER TABLE ... ENGINE=BLACKHOLE`` between a run's start and ``H``: the ALTER re-reads
    the table inside the run, which finds it one the binlog cannot keep. It fails alone, its
    last version stays as it was (equal to the source then); the other table is published."""
    _plugin(mariadb, "ha_blackhole", "BLACKHOLE")
    db = "tm_unkept_alter"
    config = two_table_pipeline(
        mariadb,
        tmp_path,
        db,
        "CREATE TABLE {db}.{name} (id INT PRIMARY KEY, v INT)",
        "INSERT INTO {db}.{name} SELECT seq, seq FROM seq_1_to_{rows}",
        (300, 200),
    )
    run_plain(config)
    published = read_manifest(table_dir(config, f"{db}.t"))
    before_first_pass(
        monkeypatch,
        mariadb,
        db,
        "UPDATE t SET v = 0 WHERE id = 1",
        "ALTER TABLE t ENGINE=BLACKHOLE",
        "INSERT INTO t VALUES (1001, 1), (1002, 2)",
        "INSERT INTO other VALUES (1001, 1)",
    )
    with pytest.raises(TablesFailed) as partial:
        run(config)
    assert list(partial.value.failed) == [f"{db}.t"]
    assert "is now a BLACKHOLE table" in partial.value.failed[f"{db}.t"]["reason"]
    assert read_manifest(table_dir(config, f"{db}.t")) == published
    assert_lake_equals_source(config, mariadb, [f"{db}.other"])
