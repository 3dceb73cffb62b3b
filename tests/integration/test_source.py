"""`orchestrator.source.connection.Source` against private MariaDB servers: shapes, positions,
errors, retries."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pymysql
import pytest
import tenacity

from orchestrator.app.demo.localdb import LocalMariaDB, free_port
from orchestrator.app.run import run_command
from orchestrator.binlog.failover import Follower, continues_at
from orchestrator.binlog.gtid import parse_mariadb, same_set
from orchestrator.config import SourceConfig, load_config
from orchestrator.errors import RunFailed, SourceNotReady
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.positions import BinlogPosition
from orchestrator.source.connection import Source
from orchestrator.source.retry import is_transient, transient_retry
from tests.conftest import (
    HAVE_MARIADB,
    assert_lake_equals_source,
    chunked_config,
    fresh_database,
    load_pipeline,
)

pytestmark = pytest.mark.integration

DB = "tm_source"


def config_for(server: LocalMariaDB, user: str = "root", **changes: Any) -> SourceConfig:
    return replace(
        SourceConfig(host="127.0.0.1", port=server.port, user=user, server_id=54001), **changes
    )


@pytest.fixture(scope="module")
def shop(mariadb: LocalMariaDB) -> LocalMariaDB:
    fresh_database(
        mariadb,
        DB,
        f"""CREATE TABLE {DB}.orders (
            id BIGINT UNSIGNED NOT NULL,
            code VARCHAR(20) NOT NULL,
            alt INT NULL,
            note VARCHAR(200) NOT NULL,
            amount DECIMAL(12, 2),
            flag TINYINT(1) NOT NULL DEFAULT 0,
            created DATETIME(3) NOT NULL,
            PRIMARY KEY (id),
            UNIQUE KEY u_code (code),
            UNIQUE KEY u_alt (alt),
            UNIQUE KEY u_note_prefix (note(5)),
            UNIQUE KEY u_pair (created, code),
            KEY k_amount (amount)
        ) ENGINE=InnoDB""",
        f"CREATE TABLE {DB}.items (order_id INT NOT NULL, line_no SMALLINT NOT NULL, sku CHAR(8),"
        " PRIMARY KEY (order_id, line_no))",
        f"CREATE TABLE {DB}.loose (a INT, b INT)",
        f"INSERT INTO {DB}.orders VALUES (1, 'a', NULL, 'n1', 1.50, 1, NOW(3)),"
        " (2, 'b', 7, 'n2', NULL, 0, NOW(3))",
        f"ANALYZE TABLE {DB}.orders",
    )
    return mariadb


@pytest.fixture
def source(shop: LocalMariaDB) -> Iterator[Source]:
    with Source(config_for(shop), "") as src:
        yield src


# --------------------------------------------------------------------------- shapes


def test_table_info_columns_keys_and_estimate(source: Source) -> None:
    info = source.table_info(f"{DB}.orders")
    assert info.name == f"{DB}.orders" and info.engine == "InnoDB"
    assert [c.name for c in info.columns] == [
        "id",
        "code",
        "alt",
        "note",
        "amount",
        "flag",
        "created",
    ]
    id_, code, alt, _note, amount, flag, created = info.columns
    assert (id_.data_type, id_.unsigned, id_.nullable) == ("bigint", True, False)
    assert code.data_type == "varchar" and code.charset is not None and code.collation is not None
    assert alt.nullable and not code.nullable
    assert (amount.precision, amount.scale) == (12, 2)
    assert flag.display_width == 1
    assert (created.data_type, created.datetime_precision) == ("datetime", 3)
    assert info.primary_key == ("id",)
    # u_alt allows NULL, u_note_prefix indexes only a prefix: neither identifies a row.
    assert info.unique_not_null_keys == (("id",), ("code",), ("created", "code"))
    assert info.row_estimate >= 1


def test_table_info_composite_and_missing_keys(source: Source) -> None:
    items = source.table_info(f"{DB}.items")
    assert items.primary_key == ("order_id", "line_no")
    assert items.unique_not_null_keys == (("order_id", "line_no"),)
    loose = source.table_info(f"{DB}.loose")
    assert loose.primary_key == () and loose.unique_not_null_keys == ()


def test_table_info_missing_table_names_it(source: Source, shop: LocalMariaDB) -> None:
    with pytest.raises(
        SourceNotReady, match=rf"table {DB}.nope does not exist on 127.0.0.1:{shop.port}"
    ):
        source.table_info(f"{DB}.nope")


# --------------------------------------------------------------------------- server and binlog


def test_version_and_variables(source: Source) -> None:
    assert source.dialect.flavor == "mariadb" and "MariaDB" in source.server_version()
    assert source.dialect.binlog_status_sql == "SHOW MASTER STATUS"
    found = source.variables("log_bin", "binlog_format", "binlog_row_image", "no_such_variable_x")
    assert found == {
        "log_bin": "ON",
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "no_such_variable_x": None,
    }
    assert source.variables() == {}


def test_query_params_are_escaped(source: Source) -> None:
    hostile = 'it\'s a \\ "test" \x00 ünï; DROP TABLE x; --'
    assert source.query("SELECT %s, %s", (hostile, 18446744073709551615)) == [
        (hostile, 18446744073709551615)
    ]


def test_session_time_zone_and_charset(shop: LocalMariaDB) -> None:
    with Source(config_for(shop, time_zone="+02:00"), "") as src:
        assert src.query("SELECT @@session.time_zone, @@character_set_client, @@autocommit") == [
            ("+02:00", "utf8mb4", 1)
        ]


def test_unknown_time_zone_is_one_clear_error(shop: LocalMariaDB) -> None:
    with (
        Source(config_for(shop, time_zone="Mars/Olympus"), "") as src,
        pytest.raises(SourceNotReady, match=r"source\.time_zone 'Mars/Olympus' is unknown"),
    ):
        src.query("SELECT 1")


def test_current_position_moves_with_writes(source: Source, shop: LocalMariaDB) -> None:
    before = source.current_position()
    assert before.file == source.binlogs()[-1][0]
    shop.execute(f"INSERT INTO {DB}.items VALUES (1, 1, 'x')")
    after = source.current_position()
    assert after > before
    assert after.gtid_set is not None
    assert after.gtid_set == shop.execute("SELECT @@gtid_binlog_pos")[0][0]
    assert BinlogPosition.from_json(after.to_json()) == after


def _asked(src: Source, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements ``src.query`` is asked from now on."""
    asked: list[str] = []
    query = src.query

    def recording(sql: str, params: Any = None) -> Any:
        asked.append(sql)
        return query(sql, params)

    monkeypatch.setattr(src, "query", recording)
    return asked


def test_a_quiet_servers_position_takes_its_gtid_set_without_reading_the_binlog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Event groups in two replication domains and from another server_id: the position's set
    is ``@@gtid_binlog_pos``, read around the status statement, and names the same set as
    ``BINLOG_GTID_POS`` at that position, which is not asked."""
    server = LocalMariaDB.create(base_dir=tmp_path)
    try:
        server.start()
        server.execute(
            "CREATE DATABASE g",
            "CREATE TABLE g.t (a INT)",
            "INSERT INTO g.t VALUES (1)",
            "SET SESSION gtid_domain_id = 3",
            "INSERT INTO g.t VALUES (2)",
            "SET SESSION server_id = 77",
            "INSERT INTO g.t VALUES (3)",
        )
        with Source(config_for(server), "") as src:
            asked = _asked(src, monkeypatch)
            position = src.current_position()
            assert not [sql for sql in asked if "BINLOG_GTID_POS" in sql]
            assert position.gtid_set is not None
            domains = parse_mariadb(position.gtid_set)
            assert sorted(domains) == [0, 3] and domains[3] == (77, 2)
            at = server.execute(f"SELECT BINLOG_GTID_POS('{position.file}', {position.pos})")
            assert same_set(position.gtid_set, at[0][0], "mariadb")
            server.execute("FLUSH BINARY LOGS")  # a new file: its start has the same set
            rotated = src.current_position()
            assert rotated.file != position.file and rotated.gtid_set == position.gtid_set
            at = server.execute(f"SELECT BINLOG_GTID_POS('{rotated.file}', {rotated.pos})")
            assert same_set(rotated.gtid_set, at[0][0], "mariadb")
            assert not [sql for sql in asked if "BINLOG_GTID_POS" in sql]
    finally:
        server.destroy()


def test_a_recorded_position_is_the_sources_own_by_the_event_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Follower.foreign` on MariaDB: a position recorded where a group ended is the source's
    own when the event there is the next transaction's GTID event, or when nothing was written
    since and it is the current position with its set (`continues_at`: one event or the status
    read, no ``BINLOG_GTID_POS``, which reads the file from its start). Where neither tells - a
    set that is not the one there, an offset inside an event - ``BINLOG_GTID_POS`` decides as
    before; after ``RESET MASTER`` the offset is not the source's."""
    server = LocalMariaDB.create(base_dir=tmp_path)
    try:
        server.start()
        server.execute("CREATE DATABASE g", "CREATE TABLE g.t (a INT PRIMARY KEY)")
        config = load_pipeline(tmp_path, server, [{"name": "g.t"}])
        with Source(config_for(server), "") as src:
            recorded = src.current_position()
            server.execute(
                "INSERT INTO g.t VALUES (1)",
                "XA START 'x'",
                "INSERT INTO g.t VALUES (2)",
                "XA END 'x'",
                "XA PREPARE 'x'",
                "XA COMMIT 'x'",
                "ALTER TABLE g.t ADD COLUMN b INT",
            )
            asked = _asked(src, monkeypatch)
            follower = Follower(config, src)
            assert continues_at(src, recorded) and follower.foreign(recorded) is None
            assert not [sql for sql in asked if "BINLOG_GTID_POS" in sql], asked
            # each group's start, an XA group's and a DDL's too, is checked the same way
            groups = server.execute(f"SHOW BINLOG EVENTS IN '{recorded.file}' FROM {recorded.pos}")
            starts = [(pos, info) for _, pos, kind, _, _, info in groups if kind == "Gtid"]
            assert len(starts) == 4 and "XA START" in starts[1][1] and "BEGIN" not in starts[3][1]
            for pos, _ in starts:
                gtid_set = server.execute(f"SELECT BINLOG_GTID_POS('{recorded.file}', {pos})")
                at = BinlogPosition(recorded.file, pos, server_id=1, gtid_set=gtid_set[0][0])
                assert continues_at(src, at), (pos, gtid_set)
            here = src.current_position()  # nothing after it yet: the current position's set
            asked.clear()
            assert continues_at(src, here) and follower.foreign(here) is None
            assert not [sql for sql in asked if "BINLOG_GTID_POS" in sql], asked
            for wrong in (
                BinlogPosition(recorded.file, recorded.pos, server_id=1, gtid_set="0-1-1"),
                BinlogPosition(here.file, here.pos, server_id=1, gtid_set="0-1-1"),
            ):  # another set at the offset: BINLOG_GTID_POS decides
                asked.clear()
                assert not continues_at(src, wrong)
                assert "was reset" in (follower.foreign(wrong) or "")
                assert [sql for sql in asked if "BINLOG_GTID_POS" in sql]
            inside = BinlogPosition(recorded.file, recorded.pos + 3, server_id=1, gtid_set="0-1-2")
            assert not continues_at(src, inside)
            server.execute("RESET MASTER", "INSERT INTO g.t VALUES (3, 3)")
            after = Follower(config, src)
            assert not continues_at(src, recorded) and after.foreign(recorded) is not None
    finally:
        server.destroy()


def test_a_commit_during_the_status_read_takes_the_set_from_the_binlog(
    source: Source, shop: LocalMariaDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction committed right after ``SHOW MASTER STATUS`` moves ``@@gtid_binlog_pos``
    past the position read: the set is then asked of ``BINLOG_GTID_POS`` at the position."""
    status = source.binlog_status
    committed: list[str] = []  # @@gtid_binlog_pos after the one commit

    def then_a_commit() -> dict[str, Any]:
        row = status()
        if not committed:
            shop.execute(f"INSERT INTO {DB}.items VALUES (900, 1, 'c')")
            committed.append(shop.execute("SELECT @@gtid_binlog_pos")[0][0])
        return row

    monkeypatch.setattr(source, "binlog_status", then_a_commit)
    asked = _asked(source, monkeypatch)
    position = source.current_position()
    assert [sql for sql in asked if "BINLOG_GTID_POS" in sql]
    assert committed and position.gtid_set != committed[0]
    at = shop.execute(f"SELECT BINLOG_GTID_POS('{position.file}', {position.pos})")[0][0]
    assert same_set(position.gtid_set, at, "mariadb")
    assert source.current_position() > position  # the commit lies after the position


def test_positions_read_under_concurrent_commits_carry_their_exact_sets(
    source: Source, shop: LocalMariaDB
) -> None:
    """Commits arrive without pause while positions are read: each position's set is the one
    ``BINLOG_GTID_POS`` gives for it, whichever way it was found."""
    stop, started = threading.Event(), threading.Event()

    def commits() -> None:
        conn = shop.connect(database=DB)
        try:
            with conn.cursor() as cur:
                n = 0
                while not stop.is_set():
                    n += 1
                    cur.execute("INSERT INTO loose VALUES (%s, %s)", (n, n))
                    conn.commit()
                    started.set()
        finally:
            conn.close()

    writer = threading.Thread(target=commits)
    writer.start()
    try:
        assert started.wait(30)
        positions = [source.current_position() for _ in range(60)]
    finally:
        stop.set()
        writer.join()
    assert len({p.pos for p in positions}) > 1  # the binlog moved while they were read
    for p in positions:
        at = shop.execute(f"SELECT BINLOG_GTID_POS('{p.file}', {p.pos})")[0][0]
        assert same_set(p.gtid_set, at, "mariadb"), (p, at)


# --------------------------------------------------------------------------- login errors


def test_wrong_password_is_one_line_without_the_password(shop: LocalMariaDB) -> None:
    shop.create_user("tm_src_user", "right-password")
    secret = "Wr0ng-Pa55-xyzzy"
    with (
        Source(config_for(shop, "tm_src_user", password_env="TM_SRC_PW"), secret) as src,
        pytest.raises(SourceNotReady) as caught,
    ):
        src.query("SELECT 1")
    message = str(caught.value)
    assert message == (
        f"cannot log in to MySQL at 127.0.0.1:{shop.port} as user `tm_src_user`: access "
        "denied; check source.user and the password (source.password_env TM_SRC_PW)"
    )
    assert secret not in message and "\n" not in message


def test_unreachable_port_fails_fast_without_retrying() -> None:
    port = free_port()
    retry = transient_retry(attempts=50, max_wait=5.0)
    with (
        Source(
            SourceConfig(host="127.0.0.1", port=port, user="snap", server_id=1), "pw", retry=retry
        ) as src,
        pytest.raises(
            SourceNotReady,
            match=rf"cannot reach MySQL at 127.0.0.1:{port}: .*refused; "
            "check source.host and source.port",
        ),
    ):
        src.server_version()
    assert retry.statistics["attempt_number"] == 1


# --------------------------------------------------------------------------- retries


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"), True),
        (pymysql.err.OperationalError(2006, "MySQL server has gone away"), True),
        (pymysql.err.OperationalError(2003, "Can't connect to MySQL server"), True),
        (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), True),
        (pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock"), True),
        (pymysql.err.OperationalError(1040, "Too many connections"), True),
        (pymysql.err.InterfaceError(0, ""), True),
        (pymysql.err.OperationalError(1045, "Access denied"), False),
        (pymysql.err.OperationalError(1049, "Unknown database 'x'"), False),
        (pymysql.err.ProgrammingError(1146, "Table 'x.y' doesn't exist"), False),
        (pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax"), False),
        (pymysql.err.OperationalError(1142, "SELECT command denied"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


@pytest.fixture(scope="module")
def crashy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    """A server of our own, killed and restarted by the tests below."""
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed")
    server = LocalMariaDB.create(base_dir=tmp_path_factory.mktemp("crashy"))
    server.start()
    server.execute(
        "CREATE DATABASE d",
        "CREATE TABLE d.t (id INT PRIMARY KEY)",
        "INSERT INTO d.t VALUES (1), (2), (3)",
    )
    yield server
    server.destroy()


def test_query_survives_a_server_crash_and_restart(crashy: LocalMariaDB) -> None:
    retry = transient_retry(attempts=120, max_wait=1.0, initial_wait=0.1)
    with Source(config_for(crashy), "", retry=retry) as src:
        first_connection = src.query("SELECT CONNECTION_ID()")[0][0]
        crashy.kill()
        errors: list[BaseException] = []

        def restart() -> None:
            try:
                crashy.start()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            rows = src.query("SELECT COUNT(*), CONNECTION_ID() FROM d.t")
        finally:
            thread.join()
        assert not errors
        assert rows[0][0] == 3
        assert rows[0][1] != first_connection  # a new connection after the crash
        assert retry.statistics["attempt_number"] >= 2


def test_lost_server_gives_up_with_a_clear_error(crashy: LocalMariaDB) -> None:
    crashy.start()
    retry = transient_retry(attempts=2, max_wait=0.1, initial_wait=0.05)
    with Source(config_for(crashy), "", retry=retry) as src:
        src.query("SELECT 1")
        crashy.kill()
        try:
            with pytest.raises(
                SourceNotReady,
                match=rf"lost the connection to MySQL at 127.0.0.1:{crashy.port}"
                r" and could not get it back after 2 attempt",
            ):
                src.query("SELECT 1")
        finally:
            crashy.start()


def test_lock_wait_is_retried_then_reported(crashy: LocalMariaDB) -> None:
    crashy.start()
    holder = crashy.connect()
    holder.autocommit(False)
    holder.cursor().execute("SELECT * FROM d.t WHERE id = 1 FOR UPDATE")

    def release_lock(state: tenacity.RetryCallState) -> None:
        holder.rollback()

    retry = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(3),
        reraise=True,
        before_sleep=release_lock,
        retry=tenacity.retry_if_exception(is_transient),
    )
    with Source(config_for(crashy), "", retry=retry) as src:
        src.query("SET SESSION innodb_lock_wait_timeout = 1")
        assert src.query("SELECT id FROM d.t WHERE id = 1 FOR UPDATE") == [(1,)]
        assert retry.statistics["attempt_number"] == 2

        holder.cursor().execute("SELECT * FROM d.t WHERE id = 2 FOR UPDATE")
        never = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(2),
            reraise=True,
            retry=tenacity.retry_if_exception(is_transient),
        )
        stuck = Source(config_for(crashy), "", retry=never)
        stuck.query("SET SESSION innodb_lock_wait_timeout = 1")
        with pytest.raises(RunFailed, match="kept failing after 2 attempt"):
            stuck.query("SELECT id FROM d.t WHERE id = 2 FOR UPDATE")
        stuck.close()
    holder.close()


def test_binlogs_oldest_first(crashy: LocalMariaDB) -> None:
    crashy.start()
    crashy.execute("FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
    with Source(config_for(crashy), "") as src:
        logs = src.binlogs()
        assert len(logs) >= 3
        assert [name for name, _ in logs] == sorted(name for name, _ in logs)
        assert all(size > 0 for _, size in logs)
        assert src.oldest_binlog() == logs[0][0]
        assert src.current_position().file == logs[-1][0]


def test_a_password_with_characters_outside_ascii_logs_in_everywhere(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """pymysql sends a text password in latin-1, MariaDB's clients and Connector/J in UTF-8, the
    bytes the server set it from: such a user could not log in before (its password was refused,
    or failed to encode). The source's connections and the binlog's (a snapshot read by the
    driver, then a change applied) log in."""
    secret = "pässwörd-ß-\U0001f511"
    database = "tm_source_utf8_password"
    fresh_database(
        mariadb,
        database,
        f"CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {database}.t SELECT seq, seq FROM seq_1_to_100",
    )
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'tm_utf8'@'%%' IDENTIFIED BY %s", (secret,))
            cur.execute(
                "GRANT SELECT, RELOAD, REPLICATION CLIENT, REPLICATION SLAVE ON *.*"
                " TO 'tm_utf8'@'%'"
            )
    finally:
        conn.close()
    with Source(config_for(mariadb, user="tm_utf8"), secret) as source:
        assert source.query("SELECT CURRENT_USER()")[0][0].startswith("tm_utf8@")
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{database}.t"}],
        name="utf8pw",
        source=mariadb.source_config(user="tm_utf8", password=secret),
    )

    def run() -> int:
        return run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False)

    assert run() == 0
    mariadb.execute(f"UPDATE {database}.t SET v = -v WHERE id <= 10")
    assert run() == 0
    assert_lake_equals_source(config, mariadb, [f"{database}.t"])


def test_a_user_of_mariadbs_ed25519_plugin_logs_in_everywhere(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MariaDB's strongest password plugin (``IDENTIFIED VIA ed25519``): pymysql signs its
    challenge with PyNaCl, which Tidemark did not install, so every command failed with
    "'pynacl' package is required". The source's connections, the Spark reads (Connector/J
    signs it itself) and the binlog's: a snapshot, then a change applied."""
    secret = "ed-pässwörd"
    database = "tm_source_ed25519"
    fresh_database(
        mariadb,
        database,
        f"CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {database}.t SELECT seq, seq FROM seq_1_to_{LOCAL_ROWS + 500}",
    )
    if not mariadb.execute(
        "SELECT 1 FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'ed25519'"
    ):
        mariadb.execute("INSTALL SONAME 'auth_ed25519'")
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "CREATE USER IF NOT EXISTS 'tm_ed'@'%%' IDENTIFIED VIA ed25519 USING PASSWORD(%s)",
                (secret,),
            )
            cur.execute(
                "GRANT SELECT, RELOAD, REPLICATION CLIENT, REPLICATION SLAVE ON *.* TO 'tm_ed'@'%'"
            )
    finally:
        conn.close()
    config = load_config(
        chunked_config(
            tmp_path,
            mariadb,
            [f"{database}.t"],
            "ed25519",
            source=mariadb.source_config(user="tm_ed", password=secret),
        )
    )

    def run() -> int:
        return run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False)

    with caplog.at_level(logging.INFO, logger="tidemark.planning"):
        assert run() == 0
    assert f"table {database}.t: snapshot, 3 chunks" in caplog.text  # read by Spark
    mariadb.execute(f"UPDATE {database}.t SET v = -v WHERE id <= 10")
    assert run() == 0
    assert_lake_equals_source(config, mariadb, [f"{database}.t"])
