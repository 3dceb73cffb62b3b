"""``where`` filters on the binlog path (orchestrator.schema.filters,
orchestrator.pipeline.capture.filtering).

The property test is MariaDB itself against the evaluator: random rows of several
column types (NULLs, a ``_ci`` column, a ``_bin`` one, a latin1 one) are written, the
binlog decoder turns them into the values capture sees, and for thousands of random
filters from a small grammar ``SELECT id FROM t WHERE <filter>`` must equal the ids
whose row the evaluator finds True. The generator is seeded (``TIDEMARK_FILTER_SEED``
picks another seed; a failure prints the seed and the filter). The end-to-end test
moves rows in and out of a filter and checks the lake equals ``SELECT * ... WHERE``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import load_config
from orchestrator.pipeline.capture.filtering import ServerCollation
from orchestrator.pipeline.capture.step import CaptureTable, capture_changes
from orchestrator.pipeline.reconcile import rewrite as reconcile
from orchestrator.pipeline.segments import read_changes
from orchestrator.schema.filters import compile_filter
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, fresh_database, pipeline_config, write_config
from tests.integration.test_binlog import position, table_info
from tests.integration.test_capture import make_config

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("TIDEMARK_FILTER_SEED", "20261123"))
CASES = 2500
ROWS = 240

TABLE = """CREATE TABLE flt.t (
    id INT PRIMARY KEY,
    i INT NULL, u BIGINT UNSIGNED NULL, d DECIMAL(6,2) NULL, f DOUBLE NULL,
    s VARCHAR(12) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NULL,
    b VARCHAR(12) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    l VARCHAR(12) CHARACTER SET latin1 COLLATE latin1_swedish_ci NULL,
    dt DATE NULL, ts DATETIME(3) NULL, flag TINYINT(1) NULL, g FLOAT NULL)"""

TEXTS = [
    "a",
    "A",
    "a ",
    "a  ",
    "b",
    "B",
    "ab",
    "Ab ",
    "aB",
    "é",
    "E",
    "e",
    "ß",
    "ss",
    "s",
    "",
    " ",
    "aé",
    "a_b",
    "a%",
    "abc",
    "ABC",
    "x y",
]
LATIN = ["a", "A", "a ", "b", "é", "E", "e", "ü", "u", "ab", "", "Ab", "x"]
INTS = [-5, -1, 0, 1, 2, 3, 5, 7]
UNSIGNED = [0, 1, 2, 9223372036854775807, 9223372036854775808, 18446744073709551615]
DECIMALS = ["-3.50", "0.00", "0.10", "1.00", "1.25", "2.00", "9999.99"]
FLOATS = [-2.5, 0.0, 0.1, 0.5, 1.0, 2.0, 1e10]
DATES = ["2020-01-01", "2020-01-02", "2020-01-03", "2020-02-29"]
TIMES = ["00:00:00", "10:00:00", "10:00:00.500", "23:59:59.999"]


def _maybe(rng: random.Random, values: list[Any], nulls: float = 0.15) -> Any:
    return None if rng.random() < nulls else rng.choice(values)


def _sql(value: Any) -> str:
    return "NULL" if value is None else f"'{value}'" if isinstance(value, str) else repr(value)


def random_rows(rng: random.Random) -> list[tuple[Any, ...]]:
    rows = []
    for id_ in range(1, ROWS + 1):
        ts = None if rng.random() < 0.15 else f"{rng.choice(DATES)} {rng.choice(TIMES)}"
        rows.append(
            (
                id_,
                _maybe(rng, INTS),
                _maybe(rng, UNSIGNED),
                _maybe(rng, DECIMALS),
                _maybe(rng, FLOATS),
                _maybe(rng, TEXTS),
                _maybe(rng, TEXTS),
                _maybe(rng, LATIN),
                _maybe(rng, DATES),
                ts,
                _maybe(rng, [0, 1, 2]),
                _maybe(rng, FLOATS),
            )
        )
    return rows


class FilterGrammar:
    """Random filters over flt.t's columns, only of the shapes the evaluator supports."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def literal(self, column: str) -> str:
        r = self.rng
        if column == "i":
            return r.choice([str(r.choice(INTS)), "1.5", "-0.5", "2e0", "3.0", "NULL"])
        if column == "u":
            return r.choice([str(r.choice(UNSIGNED)), "1.5", "1.8446744073709552e19", "-1"])
        if column == "d":
            return r.choice([r.choice(DECIMALS), "1", "0.1e0", "1.250", "-4"])
        if column in ("f", "g"):
            return r.choice(["0.1", "0.5", "1", "1e10", "2.5e0", "-2.5", "0"])
        if column in ("s", "b"):
            return f"'{r.choice(TEXTS)}'"
        if column == "l":
            return f"'{r.choice(LATIN)}'"
        if column == "dt":
            return (
                f"'{r.choice(DATES)}'"
                if r.random() < 0.7
                else f"'{r.choice(DATES)} {r.choice(TIMES)}'"
            )
        return (
            f"'{r.choice(DATES)} {r.choice(TIMES)}'" if r.random() < 0.7 else f"'{r.choice(DATES)}'"
        )

    def like_pattern(self) -> tuple[str, str]:
        r = self.rng
        pieces = [
            r.choice(["a", "A", "b", "%", "_", "é", "e", "s", " ", "!%", "!_"])
            for _ in range(r.randint(1, 4))
        ]
        return "".join(pieces), " ESCAPE '!'" if any(
            p.startswith("!") for p in pieces
        ) or r.random() < 0.3 else ""

    def predicate(self) -> str:
        r = self.rng
        column = r.choice(["i", "u", "d", "f", "g", "s", "b", "l", "dt", "ts", "flag", "pair"])
        if column == "flag":
            return r.choice(
                [
                    "flag = 0",
                    "flag <> 0",
                    "flag != 0",
                    "flag",
                    "NOT flag",
                    "flag IS NULL",
                    "flag IS NOT NULL",
                    "0 = flag",
                    "flag <=> 0",
                ]
            )
        if column == "pair":
            return r.choice(
                [
                    "i < d",
                    "i = d",
                    "d >= f",
                    "i <=> u",
                    "i <> f",
                    "s = s",
                    "b > b",
                    "i = u",
                    "g = f",
                    "g < d",
                ]
            )
        shape = r.random()
        if column in ("s", "b", "l") and shape < 0.25:
            pattern, escape = self.like_pattern()
            if column == "l":
                pattern = pattern.replace("ß", "s")
            negate = " NOT" if r.random() < 0.3 else ""
            return f"{column}{negate} LIKE '{pattern}'{escape}"
        if shape < 0.55:
            op = r.choice(["=", "<>", "!=", "<", "<=", ">", ">=", "<=>"])
            left, right = column, self.literal(column)
            return f"{left} {op} {right}" if r.random() < 0.8 else f"{right} {op} {left}"
        if shape < 0.7:
            items = ", ".join(self.literal(column) for _ in range(r.randint(1, 4)))
            return f"{column}{' NOT' if r.random() < 0.3 else ''} IN ({items})"
        if shape < 0.85:
            low, high = self.literal(column), self.literal(column)
            return f"{column}{' NOT' if r.random() < 0.3 else ''} BETWEEN {low} AND {high}"
        return f"{column} IS {r.choice(['NULL', 'NOT NULL'])}"

    def filter(self, depth: int = 3) -> str:
        r = self.rng
        if depth == 0 or r.random() < 0.35:
            return self.predicate()
        kind = r.random()
        if kind < 0.15:
            return f"NOT ({self.filter(depth - 1)})"
        if kind < 0.25:
            return f"({self.filter(depth - 1)}) IS {r.choice(['TRUE', 'FALSE', 'NOT TRUE'])}"
        op = r.choice(["AND", "OR", "XOR", "&&", "||"])
        left, right = self.filter(depth - 1), self.filter(depth - 1)
        if r.random() < 0.5:  # unparenthesised: MySQL's precedence must be sqlglot's
            return f"{left} {op} {right}"
        return f"({left}) {op} ({right})"


def decoded_rows(
    tmp_path: Path, server: LocalMariaDB, rows: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """The rows as the binlog decoder gives them to the filter: inserted, then captured."""
    start = position(server)
    values = ", ".join("(" + ", ".join(_sql(v) for v in row) + ")" for row in rows)
    server.execute(f"INSERT INTO flt.t VALUES {values}")
    stop = position(server)
    config = make_config(tmp_path, server, ["flt.t"])
    store = StateStore(config.state.url)
    run_id = store.create_run("cap", {}).run_id
    capture_changes(
        config,
        store,
        run_id,
        {"flt.t": CaptureTable(table_info(server, "flt.t"), ("id",), start)},
        stop,
    )
    return read_changes(store, config.staging_path, run_id, "flt.t").to_pylist()


def test_evaluator_agrees_with_mariadb(tmp_path: Path, mariadb: LocalMariaDB) -> None:
    fresh_database(mariadb, "flt", TABLE)
    rng = random.Random(SEED)
    images = decoded_rows(tmp_path, mariadb, random_rows(rng))
    assert len(images) == ROWS
    info = table_info(mariadb, "flt.t")
    conn = mariadb.connect(database="flt")
    grammar = FilterGrammar(rng)
    try:
        with conn.cursor() as cur:

            def query(sql: str, params: Any) -> Any:
                cur.execute(sql, params)
                return cur.fetchall()

            oracle = ServerCollation(query)
            seen: set[str] = set()
            while len(seen) < CASES:
                where = grammar.filter()
                if where in seen:
                    continue
                seen.add(where)
                cur.execute(f"SELECT id FROM flt.t WHERE {where}")
                expected = sorted(row[0] for row in cur.fetchall())
                verdict: Callable[[dict[str, Any]], bool | None] = compile_filter(
                    where, info, oracle
                )
                got = sorted(r["id"] for r in images if verdict(r) is True)
                assert got == expected, (
                    f"seed {SEED}, filter `{where}`: MariaDB {_diff(expected, got, images)}"
                )
    finally:
        conn.close()


def _diff(expected: list[int], got: list[int], images: list[dict[str, Any]]) -> str:
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    by_id = {r["id"]: {k: v for k, v in r.items() if not k.startswith("_tm")} for r in images}
    return f"also has {[by_id[i] for i in missing[:3]]}, not {[by_id[i] for i in extra[:3]]}"


@pytest.mark.parametrize("rewrite", ["local", "spark"])
def test_changes_in_and_out_of_the_filter(
    tmp_path: Path, mariadb: LocalMariaDB, rewrite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snapshot, then updates moving rows (and keys) in and out of the filter, inserts inside
    and outside, deletes: after the incremental run the lake is ``SELECT * ... WHERE``."""
    if rewrite == "spark":
        monkeypatch.setattr(reconcile, "LOCAL_CHANGES_BYTES", 0)  # the driver never rewrites
    db = f"flt_run_{rewrite}"
    where = "deleted = 0 AND (name <> 'hidden' OR v >= 100) AND v < 500"
    fresh_database(
        mariadb,
        db,
        f"""CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT NOT NULL,
        name VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL,
        deleted TINYINT(1) NOT NULL DEFAULT 0)""",
    )
    values = ", ".join(
        f"({i}, {i % 700}, '{'HIDDEN' if i % 11 == 0 else 'x'}', {int(i % 7 == 0)})"
        for i in range(1, 3001)
    )
    mariadb.execute(f"INSERT INTO {db}.t VALUES {values}")
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(tmp_path, mariadb, [{"name": f"{db}.t", "where": where}], name=db),
    )
    config = load_config(config_path)
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    assert_lake_equals_source(config, mariadb, [f"{db}.t"])

    mariadb.execute(
        "UPDATE t SET v = 600 WHERE id BETWEEN 1 AND 40",  # out of the filter
        "UPDATE t SET v = 10 WHERE id BETWEEN 550 AND 600",  # into it (v was >= 500)
        "UPDATE t SET deleted = 1 WHERE id BETWEEN 100 AND 130",  # soft-deleted: leaves
        "UPDATE t SET deleted = 0 WHERE id IN (7, 14, 21, 28)",  # undeleted: enters
        "UPDATE t SET name = 'Hidden ' WHERE id BETWEEN 200 AND 220",  # _ci and pad: leaves
        "UPDATE t SET name = 'shown' WHERE id IN (11, 22, 33)",  # enters
        "UPDATE t SET id = id + 10000 WHERE id BETWEEN 300 AND 310",  # key moves, stays in
        "UPDATE t SET id = id + 20000, v = 900 WHERE id BETWEEN 311 AND 320",  # moves and leaves
        "UPDATE t SET id = id + 30000, v = 1 WHERE id BETWEEN 501 AND 520",  # moves and enters
        "INSERT INTO t VALUES (5001, 1, 'x', 0), (5002, 900, 'x', 0), (5003, 1, 'x', 1)",
        "INSERT INTO t VALUES (5004, 2, 'hidden', 0), (5005, 200, 'HIDDEN', 0)",
        "UPDATE t SET v = 700 WHERE id = 5001",
        "UPDATE t SET v = 3 WHERE id = 5002",
        "DELETE FROM t WHERE id BETWEEN 400 AND 420",
        "DELETE FROM t WHERE id BETWEEN 560 AND 565",
        database=db,
    )
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    assert_lake_equals_source(config, mariadb, [f"{db}.t"])
