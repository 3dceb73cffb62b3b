"""orchestrator.schema.filters and orchestrator.pipeline.capture.filtering without a server.

MariaDB's own verdicts are tested in tests/integration/test_filters.py; here: what is
refused (and how it is said), NULL logic on hand-picked rows, and how a segment's
changes that leave the filter become deletes.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from orchestrator.config import parse_config
from orchestrator.errors import ConfigError
from orchestrator.pipeline.capture.filtering import ChangeFilters, compile_table_filter
from orchestrator.schema.filters import FilterError, check_filter, compile_filter
from orchestrator.schema.tables import ColumnInfo, TableInfo

T = TableInfo(
    "db",
    "t",
    (
        ColumnInfo("id", "int", "int(11)", False),
        ColumnInfo("v", "int", "int(11)", True),
        ColumnInfo("u", "bigint", "bigint(20) unsigned", True),
        ColumnInfo("d", "decimal", "decimal(6,2)", True, precision=6, scale=2),
        ColumnInfo(
            "name", "varchar", "varchar(20)", True, charset="utf8mb4", collation="utf8mb4_bin"
        ),
        ColumnInfo(
            "ci", "varchar", "varchar(20)", True, charset="utf8mb4", collation="utf8mb4_general_ci"
        ),
        ColumnInfo("day", "date", "date", True),
        ColumnInfo("at", "datetime", "datetime", True),
        ColumnInfo("ts", "timestamp", "timestamp", True),
        ColumnInfo("deleted", "tinyint", "tinyint(1)", False),
        ColumnInfo("e", "enum", "enum('a','b')", True),
        ColumnInfo("ip", "inet6", "inet6", True),
    ),
    ("id",),
    (),
    0,
)


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("created_at > NOW()", "`NOW()` is not supported"),
        ("v IN (SELECT 1)", "only IN with a list of values"),
        ("@x = 1", "`@x` is not supported"),
        ("v + 1 > 2", "`v + 1` is not supported"),
        ("t.v = 1", "name columns without a table"),
        ("name LIKE 'a\\\\%'", "backslashes in string literals"),
        ("v = ", "is not valid SQL"),
        ("name LIKE v", "a LIKE pattern must be a quoted string"),
        # a comment: the server may run /*! */ (the read would take rows the binlog filter drops),
        # -- and # would swallow the read's closing parenthesis
        ("v = 1 /*!) OR (1=1 */", "holds a comment"),
        ("v = 1 -- live rows", "holds a comment"),
        ("v = 1 # live rows", "holds a comment"),
        ("v = 1.0e", "could not convert"),
    ],
)
def test_validate_refuses_what_is_not_exact(where: str, says: str) -> None:
    message = check_filter(where)
    assert message is not None and says in message and where.split()[0] in message


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("v = '1'", "comparing column `v` (INT(11)) with the literal '1' is not supported"),
        ("name = 1", "write the literal in the column's type"),
        ("ts > '2020-01-01'", "column `ts` is TIMESTAMP"),
        ("e = 'a'", "column `e` is ENUM"),
        ("ip = '::1'", "column `ip` is INET6"),  # the server reads '0::1' as the same address
        ("deleted = 1", "compare it with 0 only"),
        ("day > '2020/01/01'", "is not a date in the form"),
        ("nope = 1", "table db.t has no column `nope`"),
        ("ci = name", "different collations"),
        ("'a' = 'b'", "comparing two string literals"),
    ],
)
def test_binding_to_the_table_refuses_type_mixes(where: str, says: str) -> None:
    with pytest.raises(FilterError) as info:
        compile_filter(where, T, None)
    assert says in str(info.value)
    with pytest.raises(ConfigError, match=r"table db\.t: the filter"):
        compile_table_filter(where, T, None)


ROW: dict[str, Any] = {
    "id": 1,
    "v": None,
    "u": Decimal(18446744073709551615),
    "d": Decimal("1.50"),
    "name": "ab ",
    "ci": "x",
    "day": dt.date(2020, 1, 2),
    "at": dt.datetime(2020, 1, 2, 10, 0),
    "ts": None,
    "deleted": False,
    "e": "a",
}


@pytest.mark.parametrize(
    ("where", "verdict"),
    [
        ("v = 1", None),
        ("v <=> NULL", True),
        ("NOT v = 1", None),
        ("v = 1 AND 1 = 0", False),
        ("v = 1 OR 1 = 1", True),
        ("v = 1 XOR 1 = 1", None),
        ("v IN (1, 2)", None),
        ("d IN (1.5, NULL)", True),
        ("d NOT IN (2, NULL)", None),
        ("v IS NULL", True),
        ("(v = 1) IS NOT TRUE", True),
        ("d BETWEEN 1 AND 2", True),
        ("d = 1.5e0", True),
        ("u = 18446744073709551615", True),
        ("u > 18446744073709551614", True),
        ("name = 'ab'", True),
        ("name LIKE 'ab'", False),
        ("name LIKE 'a_ '", True),
        ("name LIKE 'a!_%' ESCAPE '!'", False),
        ("day = '2020-01-02'", True),
        ("day < '2020-01-02 00:00:01'", True),
        ("at >= '2020-01-02'", True),
        ("deleted = 0", True),
        ("NOT deleted", True),
        ("deleted <> 0", False),
    ],
)
def test_verdicts_on_one_row(where: str, verdict: bool | None) -> None:
    assert compile_filter(where, T, None)(ROW) is verdict


class _Table:
    def __init__(
        self, info: TableInfo, key: tuple[str, ...], where: str | None, multiset: bool = False
    ) -> None:
        self.info, self.key, self.where, self.multiset = info, key, where, multiset


def test_changes_leaving_the_filter_become_deletes_of_both_keys() -> None:
    info = TableInfo(
        "db",
        "s",
        (ColumnInfo("id", "int", "int(11)", False), ColumnInfo("v", "int", "int(11)", True)),
        ("id",),
        (),
        0,
    )
    filters = ChangeFilters({"db.s": _Table(info, ("id",), "v < 10")})
    segment = pa.table(
        {
            "_tm_file": [1] * 6,
            "_tm_pos": [10, 20, 30, 40, 50, 60],
            "_tm_row": [0] * 6,
            "_tm_op": ["I", "I", "U", "U", "D", "U"],
            "id": [1, 2, 3, 5, 6, 7],
            "v": [1, 50, 70, 2, 99, None],
            "_tm_old_id": [None, None, 3, 4, 6, 7],
        }
    )
    out = filters.apply("db.s", segment)
    assert out.column("_tm_op").to_pylist() == ["I", "D", "D", "U", "D", "D"]
    assert out.column("_tm_old_id").to_pylist() == [None, 2, 3, 4, 6, 7]
    assert out.column("v").to_pylist() == segment.column("v").to_pylist()
    assert filters.apply("db.other", segment) is segment


def test_a_table_without_a_key_counts_only_the_images_that_match() -> None:
    """Its rows count (`orchestrator.pipeline.keyless`): a change keeps the images that match, and
    an update leaving the filter becomes a delete of its before image."""
    info = TableInfo(
        "db",
        "h",
        (ColumnInfo("a", "int", "int(11)", True), ColumnInfo("v", "int", "int(11)", True)),
        (),
        (),
        0,
    )
    filters = ChangeFilters({"db.h": _Table(info, ("a", "v"), "v < 10", multiset=True)})
    segment = pa.table(
        {
            "_tm_file": [1] * 8,
            "_tm_pos": [10, 20, 30, 40, 50, 60, 70, 80],
            "_tm_row": [0] * 8,
            "_tm_op": ["I", "I", "D", "D", "U", "U", "U", "U"],
            "a": [1, 2, 3, 4, 5, 6, 7, 8],
            "v": [1, 50, 2, 60, 3, 70, 4, 80],
            "_tm_old_a": [None, None, 3, 4, 5, 6, 7, 8],
            "_tm_old_v": [None, None, 2, 60, 1, 9, 90, 95],
        }
    )
    out = filters.apply("db.h", segment)
    # kept: the matching insert and delete; updates in both, out of it (a delete of the before
    # image), into it (an insert of the after image); dropped: whatever never matched
    assert out.column("_tm_pos").to_pylist() == [10, 30, 50, 60, 70]
    assert out.column("_tm_op").to_pylist() == ["I", "D", "U", "D", "I"]
    assert out.column("v").to_pylist() == [1, 2, 3, 9, 4]
    assert out.column("a").to_pylist() == [1, 3, 5, 6, 7]


def test_config_with_an_unsupported_filter_names_the_key(tmp_path: Path) -> None:
    data = {
        "pipeline": "p",
        "source": {"host": "h", "user": "u", "password": "x", "server_id": 5},
        "output": {"path": str(tmp_path)},
        "state": {"url": "sqlite://"},
        "tables": [{"name": "db.t", "where": "updated_at > NOW() - INTERVAL 1 DAY"}],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert "tables[0].where" in str(info.value) and "is not supported" in str(info.value)
