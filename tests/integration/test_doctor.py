"""`tidemark doctor` against private MariaDB servers with good and bad settings, users and
tables."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from orchestrator.app.doctor import Check, doctor_command, preflight, run_checks
from orchestrator.config import PipelineConfig, parse_config
from orchestrator.errors import SourceNotReady
from orchestrator.source.grants import allows, parse_grant
from tests.conftest import HAVE_MARIADB, pipeline_config, write_config

pytestmark = pytest.mark.integration

DB = "tm_doctor"
TIDEMARK = Path(sys.executable).parent / "tidemark"
GOOD_PASSWORD = "Good-Pa55-for-doctor"


def make_config(
    tmp_path: Path,
    server: LocalMariaDB,
    tables: list[dict[str, Any]],
    user: str = "root",
    password: str | None = None,
    **defaults: Any,
) -> PipelineConfig:
    data = pipeline_config(tmp_path, server, tables, name="doctor")
    data["source"] = server.source_config(user, password)
    data["defaults"].update(defaults)
    return parse_config(data)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def failed(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if not c.ok}


def create_shop(server: LocalMariaDB) -> None:
    server.execute(
        f"CREATE DATABASE IF NOT EXISTS {DB}",
        f"CREATE TABLE IF NOT EXISTS {DB}.orders (id BIGINT PRIMARY KEY, total DECIMAL(10, 2),"
        " note TEXT)",
        f"CREATE TABLE IF NOT EXISTS {DB}.customers (id INT PRIMARY KEY, name VARCHAR(50))",
        f"CREATE TABLE IF NOT EXISTS {DB}.nopk (code VARCHAR(10) NOT NULL, alt INT NULL,"
        " other INT NOT NULL, UNIQUE KEY u_code (code), UNIQUE KEY u_alt (alt),"
        " KEY k_other (other))",
        f"CREATE TABLE IF NOT EXISTS {DB}.places (id INT PRIMARY KEY, spot POINT)",
        f"CREATE TABLE IF NOT EXISTS {DB}.pairs (a INT NOT NULL, b INT NOT NULL,"
        " UNIQUE KEY u_ab (a, b))",
    )


@pytest.fixture(scope="module")
def good(mariadb: LocalMariaDB) -> LocalMariaDB:
    """The session server, with the test tables and users."""
    create_shop(mariadb)
    mariadb.create_user("tm_doc_ok", GOOD_PASSWORD)
    mariadb.create_user("tm_doc_select", GOOD_PASSWORD, replication=False)
    mariadb.execute(
        "CREATE USER IF NOT EXISTS 'tm_doc_tbl'@'%' IDENTIFIED BY 'tbl-pass'",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'tm_doc_tbl'@'%'",
        f"GRANT SELECT ON {DB}.orders TO 'tm_doc_tbl'@'%'",
    )
    return mariadb


TABLES = [{"name": f"{DB}.orders"}, {"name": f"{DB}.customers"}]


# --------------------------------------------------------------------------- good server


def test_good_server_and_minimal_grants_pass(
    good: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path, good, TABLES, "tm_doc_ok", GOOD_PASSWORD)
    checks = run_checks(config)
    assert failed(checks) == set(), [c.line() for c in checks if not c.ok]
    names = set(by_name(checks))
    assert {
        "reachable",
        "log_bin",
        "binlog_format",
        "binlog_row_image",
        "binlog_row_metadata",
        "binlog_do_db",
        "binlog_ignore_db",
        "binlog retention",
        "server_id",
        "privilege REPLICATION SLAVE",
        "privilege REPLICATION CLIENT",
        "privilege SELECT",
        f"table {DB}.orders",
        f"chunk key {DB}.orders",
        f"types {DB}.customers",
        f"column names {DB}.orders",
    } <= names
    assert "tm_doc_ok@%" in by_name(checks)["reachable"].detail

    assert doctor_command(config) == 0
    out, err = capsys.readouterr()
    # the source's checks, then where the run writes (output, its free space, the state store,
    # the Iceberg catalog), that the binlog the state store goes on from is kept and is the
    # source's, the summary
    assert len(out.strip().splitlines()) == len(checks) + 6 + 1
    assert "PASS  output:" in out and "PASS  state store:" in out and "PASS  binlog kept" in out
    assert "PASS  Iceberg catalog: `tidemark` opens" in out
    assert "PASS  server identity: every position the state store goes on from is" in out
    assert (
        "PASS  replica binlog:" in out
        and "PASS  gtid_strict_mode: gtid_strict_mode = OFF; ON is recommended" in out
    )
    assert all(line.startswith("PASS  ") for line in out.splitlines()[:-1])
    assert "all" in out.splitlines()[-1] and err == ""
    preflight(config)  # does not raise


def test_select_only_user_fails_naming_the_privileges(
    good: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path, good, TABLES, "tm_doc_select", GOOD_PASSWORD)
    checks = by_name(run_checks(config))
    assert {n for n, c in checks.items() if not c.ok} == {
        "privilege REPLICATION SLAVE",
        "privilege REPLICATION CLIENT",
    }
    assert (
        checks["privilege REPLICATION SLAVE"].fix
        == "GRANT REPLICATION SLAVE ON *.* TO 'tm_doc_select'@'%'"
    )
    assert "lacks REPLICATION CLIENT" in checks["privilege REPLICATION CLIENT"].detail
    assert checks["binlog filters"].detail.startswith("not checked: SHOW MASTER STATUS was refused")

    assert doctor_command(config) == 3
    out, err = capsys.readouterr()
    assert "FAIL  privilege REPLICATION SLAVE: 'tm_doc_select'@'%' lacks REPLICATION SLAVE" in out
    assert err.strip() == (
        "tidemark: error: doctor: 2 of 32 checks failed: "  # the 32nd: foreign-key cascades
        "privilege REPLICATION SLAVE, privilege REPLICATION CLIENT"
    )


def test_table_level_select_grant_names_the_other_table(good: LocalMariaDB, tmp_path: Path) -> None:
    config = make_config(tmp_path, good, TABLES, "tm_doc_tbl", "tbl-pass")
    checks = by_name(run_checks(config))
    select = checks["privilege SELECT"]
    assert not select.ok
    assert select.detail == f"'tm_doc_tbl'@'%' lacks SELECT on {DB}.customers"
    assert select.fix == f"GRANT SELECT ON `{DB}`.`customers` TO 'tm_doc_tbl'@'%'"
    # Without any privilege on it, the user cannot even see the table.
    assert not checks[f"table {DB}.customers"].ok
    assert checks[f"table {DB}.orders"].ok and checks["privilege REPLICATION CLIENT"].ok


def test_missing_table_and_table_without_key(good: LocalMariaDB, tmp_path: Path) -> None:
    tables = [{"name": f"{DB}.orders"}, {"name": f"{DB}.nope"}, {"name": f"{DB}.nopk"}]
    config = make_config(tmp_path, good, tables)
    checks = by_name(run_checks(config))
    assert failed(list(checks.values())) == {f"table {DB}.nope", f"chunk key {DB}.nopk"}
    assert checks[f"table {DB}.nope"].detail.startswith(
        f"table {DB}.nope does not exist on 127.0.0.1:{good.port}"
    )
    assert checks[f"table {DB}.nope"].fix.startswith("check tables[1].name")
    nopk = checks[f"chunk key {DB}.nopk"]
    assert nopk.line().startswith(
        f"FAIL  chunk key {DB}.nopk: table `{DB}.nopk` has no primary key; "
        "set chunk_key: [code] for it in the config"
    )
    assert nopk.line().endswith("; fix: set tables[2].chunk_key")
    assert (
        "[alt]" not in nopk.detail
    )  # the candidate is suggested; the nullable unique `alt` is not

    # A run goes on without the tables that fail on their own (they are recorded failed) ...
    failing = preflight(config).failing
    assert sorted(failing) == [f"{DB}.nope", f"{DB}.nopk"]
    assert failing[f"{DB}.nope"].startswith(f"table {DB}.nope: ")
    assert "set tables[2].chunk_key" in failing[f"{DB}.nopk"]
    # ... but does not start when every table it was asked for fails.
    with pytest.raises(SourceNotReady) as caught:
        preflight(config, [f"{DB}.nope", f"{DB}.nopk"])
    lines = str(caught.value).splitlines()
    assert len(lines) == 2
    assert any(line.startswith(f"table {DB}.nope: ") for line in lines)
    assert any("set tables[2].chunk_key" in line for line in lines)
    # Only the tables asked for are checked.
    assert preflight(config, [f"{DB}.orders"]).failing == {}


def test_a_system_versioned_table_passes_saying_how_its_changes_are_applied(
    good: LocalMariaDB, tmp_path: Path
) -> None:
    good.execute(
        f"CREATE TABLE IF NOT EXISTS {DB}.history (id INT PRIMARY KEY, v INT)"
        " WITH SYSTEM VERSIONING",
        f"CREATE TABLE IF NOT EXISTS {DB}.by_trx (id INT PRIMARY KEY, v INT,"
        " rs BIGINT UNSIGNED GENERATED ALWAYS AS ROW START,"
        " re BIGINT UNSIGNED GENERATED ALWAYS AS ROW END,"
        " PERIOD FOR SYSTEM_TIME(rs, re)) ENGINE=InnoDB WITH SYSTEM VERSIONING",
    )
    tables = [{"name": f"{DB}.history"}, {"name": f"{DB}.by_trx"}, {"name": f"{DB}.orders"}]
    checks = by_name(run_checks(make_config(tmp_path, good, tables)))
    table = checks[f"table {DB}.history"]
    assert table.ok and table.detail.endswith(
        "; system-versioned: its history rows are left out of the changes applied"
    )
    by_trx = checks[f"table {DB}.by_trx"]
    assert by_trx.ok and by_trx.detail.endswith(
        "; system-versioned by transaction ids: logged as statements, so each change re-reads "
        "it whole (docs/limits.md)"
    )
    assert "system-versioned" not in checks[f"table {DB}.orders"].detail


@pytest.mark.parametrize(
    ("chunk_key", "ok", "expected"),
    [
        (["code"], True, "(code) from tables[0].chunk_key, a unique NOT NULL key"),
        (["CODE"], True, "a unique NOT NULL key"),
        (["alt"], False, "chunk_key [alt] is not the primary key or a unique NOT NULL key"),
        (["other"], False, "chunk_key [other] is not the primary key or a unique NOT NULL key"),
        (
            ["code", "other"],
            False,
            "chunk_key [code, other] is not the primary key or a unique NOT NULL key, "
            "so chunks could share rows; use one of: [code]",
        ),
        (
            ["missing"],
            False,
            "chunk_key column(s) missing do not exist; columns are code, alt, other",
        ),
    ],
)
def test_configured_chunk_key(
    good: LocalMariaDB, tmp_path: Path, chunk_key: list[str], ok: bool, expected: str
) -> None:
    config = make_config(tmp_path, good, [{"name": f"{DB}.nopk", "chunk_key": chunk_key}])
    check = by_name(run_checks(config))[f"chunk key {DB}.nopk"]
    assert check.ok is ok and expected in check.detail, check


def test_chunk_key_out_of_index_order_fails_as_run_would(
    good: LocalMariaDB, tmp_path: Path
) -> None:
    """A unique key (a, b) configured as [b, a]: plan refuses it, so doctor does too."""
    in_order = make_config(tmp_path, good, [{"name": f"{DB}.pairs", "chunk_key": ["a", "b"]}])
    assert by_name(run_checks(in_order))[f"chunk key {DB}.pairs"].ok
    reversed_key = make_config(tmp_path, good, [{"name": f"{DB}.pairs", "chunk_key": ["b", "a"]}])
    check = by_name(run_checks(reversed_key))[f"chunk key {DB}.pairs"]
    assert not check.ok
    assert "must list the key's columns in index order: chunk_key: [a, b]" in check.detail
    with pytest.raises(SourceNotReady, match=r"index order: chunk_key: \[a, b\]"):
        preflight(reversed_key)


def test_spatial_columns_map_and_name_their_srid(good: LocalMariaDB, tmp_path: Path) -> None:
    """A spatial column no longer fails its table: doctor says it is published as WKB, and with
    which SRID (MariaDB reports 0 for a column that declares none)."""
    checks = by_name(run_checks(make_config(tmp_path, good, [{"name": f"{DB}.places"}])))
    types = checks[f"types {DB}.places"]
    assert types.ok and "published as OGC WKB: `spot` (SRID 0)" in types.detail, types


def test_retention_shorter_than_a_run_fails(good: LocalMariaDB, tmp_path: Path) -> None:
    config = make_config(tmp_path, good, TABLES, expected_run_hours=6)
    before = good.execute("SELECT @@global.binlog_expire_logs_seconds")[0][0]
    try:
        good.execute("SET GLOBAL binlog_expire_logs_seconds = 3600")
        check = by_name(run_checks(config))["binlog retention"]
        assert not check.ok
        assert "binlogs expire after 1h (binlog_expire_logs_seconds = 3600)" in check.detail
        assert "6h, defaults.expected_run_hours" in check.detail
        assert check.fix.startswith("SET GLOBAL binlog_expire_logs_seconds = 86400 and in my.cnf")

        longer = make_config(tmp_path, good, TABLES, expected_run_hours=0.5)
        assert by_name(run_checks(longer))["binlog retention"].ok

        good.execute("SET GLOBAL binlog_expire_logs_seconds = 0")
        forever = by_name(run_checks(config))["binlog retention"]
        assert forever.ok and "kept until purged by hand" in forever.detail
    finally:
        good.execute(f"SET GLOBAL binlog_expire_logs_seconds = {int(before)}")


def test_compressed_binlog_is_reported_not_failed(good: LocalMariaDB, tmp_path: Path) -> None:
    """Compressed events are decoded: doctor reports the setting, either way a pass."""
    config = make_config(tmp_path, good, TABLES)
    checks = by_name(run_checks(config))
    assert (
        checks["log_bin_compress"].ok
        and checks["log_bin_compress"].detail == "log_bin_compress = OFF"
    )
    assert checks["binlog_transaction_compression"].ok  # MySQL's; not on MariaDB: skipped
    assert "not on this server version" in checks["binlog_transaction_compression"].detail
    try:
        good.execute("SET GLOBAL log_bin_compress = ON")
        check = by_name(run_checks(config))["log_bin_compress"]
        assert check.ok and check.detail == "log_bin_compress = ON (compressed events are decoded)"
    finally:
        good.execute("SET GLOBAL log_bin_compress = OFF")


def test_minimal_row_metadata_passes_recommending_full(good: LocalMariaDB, tmp_path: Path) -> None:
    """MINIMAL row metadata still works (the type-shape check); doctor recommends FULL."""
    config = make_config(tmp_path, good, TABLES)
    try:
        good.execute("SET GLOBAL binlog_row_metadata = MINIMAL")
        check = by_name(run_checks(config))["binlog_row_metadata"]
        assert check.ok and check.detail.startswith(
            "binlog_row_metadata = MINIMAL; FULL is recommended: with FULL each TABLE_MAP names"
        )
        assert "SET GLOBAL binlog_row_metadata = 'FULL'" in check.detail
    finally:
        good.execute("SET GLOBAL binlog_row_metadata = FULL")


def test_replica_id_equal_to_the_servers_own(good: LocalMariaDB, tmp_path: Path) -> None:
    data = pipeline_config(tmp_path, good, TABLES, name="doctor")
    data["source"]["server_id"] = int(good.execute("SELECT @@server_id")[0][0])
    check = by_name(run_checks(parse_config(data)))["server_id"]
    assert not check.ok and "is the server's own server_id" in check.detail


# --------------------------------------------------------------------------- bad servers


BAD_SERVERS = {
    "statement": (
        {**GOOD_BINLOG, "binlog-format": "STATEMENT"},
        "binlog_format",
        "STATEMENT",
        "SET GLOBAL binlog_format = 'ROW' and in my.cnf: binlog_format = ROW",
    ),
    "binlog-off": (
        {k: v for k, v in GOOD_BINLOG.items() if k != "log-bin"},
        "log_bin",
        "OFF",
        "in my.cnf set log_bin = binlog",
    ),
    "minimal-image": (
        {**GOOD_BINLOG, "binlog-row-image": "MINIMAL"},
        "binlog_row_image",
        "MINIMAL",
        "SET GLOBAL binlog_row_image = 'FULL' and in my.cnf: binlog_row_image = FULL",
    ),
    # A binlog filter leaves out statements issued from a filtered default database
    # (`USE other; TRUNCATE TABLE tm_doctor.t` is not logged under binlog-do-db=tm_doctor).
    "do-db": (
        {**GOOD_BINLOG, "binlog-do-db": DB},
        "binlog_do_db",
        DB,
        "remove every binlog_do_db (binlog-do-db) line from my.cnf and restart the server",
    ),
    "ignore-db": (
        {**GOOD_BINLOG, "binlog-ignore-db": "scratch"},
        "binlog_ignore_db",
        "scratch",
        "remove every binlog_ignore_db (binlog-ignore-db) line from my.cnf",
    ),
}


@pytest.fixture(scope="module", params=sorted(BAD_SERVERS))
def bad(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalMariaDB, str, str, str]]:
    """One server per bad setting, each started once (pytest groups the tests by param)."""
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed")
    settings, setting, value, fix = BAD_SERVERS[request.param]
    server = LocalMariaDB.create(settings, base_dir=tmp_path_factory.mktemp(request.param))
    server.start()
    create_shop(server)
    yield server, setting, value, fix
    server.destroy()


def test_bad_server_fails_naming_the_setting(
    bad: tuple[LocalMariaDB, str, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, setting, value, fix = bad
    config = make_config(tmp_path, server, TABLES)
    checks = run_checks(config)
    assert failed(checks) == {setting}
    assert doctor_command(config) == 3
    out, err = capsys.readouterr()
    line = next(x for x in out.splitlines() if x.startswith(f"FAIL  {setting}:"))
    assert f"{setting} = {value}; Tidemark needs" in line and fix in line
    assert setting in err
    with pytest.raises(SourceNotReady, match=setting):
        preflight(config)


# --------------------------------------------------------------------------- the real command


def run_doctor(config_path: Path, password: str) -> subprocess.CompletedProcess[str]:
    if not TIDEMARK.exists():
        pytest.skip(f"{TIDEMARK} is not installed (pip install -e .)")
    env = {**os.environ, "TM_DOCTOR_PW": password}
    return subprocess.run(
        [str(TIDEMARK), "doctor", "--config", str(config_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def doctor_yaml(tmp_path: Path, server: LocalMariaDB) -> Path:
    data = pipeline_config(tmp_path, server, TABLES, name="doctor")
    data["source"] = {**server.source_config("tm_doc_ok"), "password_env": "TM_DOCTOR_PW"}
    return write_config(tmp_path / "doctor.yaml", data)


def test_cli_wrong_password_is_one_clear_line(good: LocalMariaDB, tmp_path: Path) -> None:
    secret = "Wr0ng-Secret-plugh-42"
    result = run_doctor(doctor_yaml(tmp_path, good), secret)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == (
        f"tidemark: error: cannot log in to MySQL at 127.0.0.1:{good.port} as user `tm_doc_ok`: "
        "access denied; "
        "check source.user and the password (source.password_env TM_DOCTOR_PW)"
    )
    assert "Traceback" not in result.stdout + result.stderr
    assert secret not in result.stdout + result.stderr


def test_an_iceberg_catalog_that_cannot_be_opened_fails_doctor(
    good: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SQL catalog whose server refuses connections fails doctor naming output.catalog, its
    password not shown; before, doctor passed and the run failed at its first commit."""
    data = pipeline_config(tmp_path, good, TABLES, name="doctor")
    data["output"]["catalog"] = {
        "type": "sql",
        "uri": f"postgresql+psycopg://u:{GOOD_PASSWORD}@127.0.0.1:1/x",
    }
    config = parse_config(data)
    assert doctor_command(config) == 3  # not ready, as for the source's own checks
    out, _ = capsys.readouterr()
    line = next(x for x in out.splitlines() if "Iceberg catalog" in x)
    assert (
        line.startswith("FAIL  Iceberg catalog: `tidemark` cannot be opened (") and "port 1" in line
    )
    assert "check output.catalog's type and uri" in out
    assert GOOD_PASSWORD not in out


def test_cli_good_user_passes(good: LocalMariaDB, tmp_path: Path) -> None:
    result = run_doctor(doctor_yaml(tmp_path, good), GOOD_PASSWORD)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and "PASS  privilege REPLICATION CLIENT" in result.stdout
    assert GOOD_PASSWORD not in result.stdout + result.stderr


# --------------------------------------------------------------------------- SHOW GRANTS parsing


GRANTS = [
    # MariaDB 10.11 prints REPLICATION CLIENT as BINLOG MONITOR, with the password hash.
    (
        "GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `snap`@`%`"
        " IDENTIFIED BY PASSWORD '*D82'",
        {"REPLICATION CLIENT", "BINLOG MONITOR"},
        None,
        None,
        True,
    ),
    (
        "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snap`@`%`",  # MySQL 8
        {"REPLICATION CLIENT", "BINLOG MONITOR"},
        None,
        None,
        True,
    ),
    ("GRANT USAGE ON *.* TO `snap`@`%`", {"SELECT"}, "shop", "orders", False),
    (
        "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION",
        {"REPLICATION SLAVE"},
        None,
        None,
        True,
    ),
    ("GRANT ALL PRIVILEGES ON `shop`.* TO `snap`@`%`", {"SELECT"}, "shop", "orders", True),
    ("GRANT ALL PRIVILEGES ON `shop`.* TO `snap`@`%`", {"REPLICATION SLAVE"}, None, None, False),
    ("GRANT SELECT ON `shop`.`orders` TO `snap`@`%`", {"SELECT"}, "shop", "orders", True),
    ("GRANT SELECT ON `shop`.`orders` TO `snap`@`%`", {"SELECT"}, "shop", "items", False),
    ("GRANT SELECT ON `shop\\_%`.* TO `snap`@`%`", {"SELECT"}, "shop_eu", "orders", True),
    ("GRANT SELECT ON `shop\\_%`.* TO `snap`@`%`", {"SELECT"}, "shopXeu", "orders", False),
    ("GRANT SELECT ON `sh_p`.* TO `snap`@`%`", {"SELECT"}, "shop", "t", True),
    (
        "GRANT SELECT (`id`, `total`) ON `shop`.`orders` TO `snap`@`%`",
        {"SELECT"},
        "shop",
        "orders",
        False,
    ),
    ("GRANT INSERT, UPDATE ON `we``ird`.`t` TO `snap`@`%`", {"INSERT"}, "we`ird", "t", True),
]


@pytest.mark.parametrize(("line", "wanted", "database", "table", "allowed"), GRANTS)
def test_grant_lines(
    line: str, wanted: set[str], database: str | None, table: str | None, allowed: bool
) -> None:
    grant = parse_grant(line)
    assert grant is not None
    assert allows([grant], wanted, database, table) is allowed


@pytest.mark.parametrize(
    "line",
    [
        "GRANT `r1` TO `snap`@`%`",
        "GRANT PROXY ON ''@'%' TO 'root'@'localhost' WITH GRANT OPTION",
        "GRANT EXECUTE ON PROCEDURE `shop`.`p` TO `snap`@`%`",
        "SET DEFAULT ROLE `r1` FOR `snap`@`%`",
    ],
)
def test_grant_lines_that_are_not_table_privileges(line: str) -> None:
    assert parse_grant(line) is None


def test_default_role_grants_count(good: LocalMariaDB, tmp_path: Path) -> None:
    """MariaDB shows the active default role's grants in SHOW GRANTS; they count."""
    good.execute(
        "CREATE ROLE IF NOT EXISTS tm_doc_role",
        "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO tm_doc_role",
        "CREATE USER IF NOT EXISTS 'tm_doc_roleuser'@'%' IDENTIFIED BY 'role-pass'",
        "GRANT tm_doc_role TO 'tm_doc_roleuser'@'%'",
        "SET DEFAULT ROLE tm_doc_role FOR 'tm_doc_roleuser'@'%'",
    )
    checks = run_checks(make_config(tmp_path, good, TABLES, "tm_doc_roleuser", "role-pass"))
    assert failed(checks) == set(), [c.line() for c in checks if not c.ok]
