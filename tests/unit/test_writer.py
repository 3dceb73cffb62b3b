"""The data files Tidemark writes with pyarrow: which Parquet encoding each column gets, and that
every value reads back as written, by pyarrow and by DuckDB (docs/output.md, "The Iceberg
table")."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.config import lakes
from orchestrator.lake import writer
from tests.iceberg_readers import duckdb_connection

#: Columns Parquet stores as INT32 or INT64, each with its edge values and a null.
INTEGERS = {
    "tiny": pa.array([-128, 127, None], pa.int8()),
    "small_unsigned": pa.array([0, 65535, None], pa.uint16()),
    "int": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
    "int_unsigned": pa.array([0, 2**32 - 1, None], pa.uint32()),
    "big": pa.array([-(2**63), 2**63 - 1, None], pa.int64()),
    "big_unsigned": pa.array([0, 2**64 - 1, None], pa.uint64()),
    "day": pa.array([dt.date(1000, 1, 1), dt.date(9999, 12, 31), None]),
    "clock": pa.array([0, 86_399_999_999, None], pa.time64("us")),
    "local": pa.array([dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59), None]),
    "instant": pa.array(
        [dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(2038, 1, 19, tzinfo=dt.UTC), None],
        pa.timestamp("us", "UTC"),
    ),
    "price": pa.array(
        [decimal.Decimal("-9999999.99"), decimal.Decimal("9999999.99"), None],
        pa.decimal128(9, 2),
    ),
    "amount": pa.array(
        [decimal.Decimal("-99999999999999.9999"), decimal.Decimal("99999999999999.9999"), None],
        pa.decimal128(18, 4),
    ),
    "nothing": pa.array([None, None, None], pa.int64()),
}

#: Whole-number DECIMALs too wide for INT64, stored as fixed-length bytes: DELTA_BYTE_ARRAY.
WIDE = {
    "huge": pa.array(
        [decimal.Decimal(0), decimal.Decimal(2**64 - 1), None], pa.decimal128(20, 0)
    ),  # BIGINT UNSIGNED
    "vast": pa.array(
        [decimal.Decimal(-(10**37) + 1), decimal.Decimal(10**37 - 1), None], pa.decimal128(38, 0)
    ),
}

#: Columns stored otherwise: PLAIN.
OTHERS = {
    "id": pa.array([1, 2, 3], pa.int64()),  # the key; an integer too
    "fraction": pa.array(
        [decimal.Decimal("-0.00001"), decimal.Decimal("123456789012345.12345"), None],
        pa.decimal128(30, 5),
    ),
    "name": pa.array(["a", "é", None]),
    "ratio": pa.array([0.5, -1.0, None], pa.float64()),
    "flag": pa.array([True, False, None]),
    "blob": pa.array([b"\x00", b"", None], pa.binary()),
}


def _table() -> pa.Table:
    columns = {**OTHERS, **INTEGERS, **WIDE}
    return pa.table(list(columns.values()), names=list(columns))


def _encodings(path: Path) -> dict[str, set[str]]:
    meta = pq.ParquetFile(path).metadata
    out: dict[str, set[str]] = {}
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            column = meta.row_group(g).column(c)
            out.setdefault(column.path_in_schema, set()).update(column.encodings)
    return out


def _written(how: str, tmp_path: Path, table: pa.Table) -> Path:
    if how == "write_table":
        writer.write_table(str(tmp_path / "t.parquet"), table)
        return tmp_path / "t.parquet"
    ranges = writer.write_files(
        str(tmp_path), lambda n: f"f{n}.parquet", table.schema, ["id"], table.to_batches(), 0, 0
    )
    assert [r["rows"] for r in ranges] == [table.num_rows]
    return tmp_path / ranges[0]["file"]


@pytest.mark.parametrize("how", ["write_table", "write_files"])
def test_integer_columns_are_delta_encoded_and_read_back_equal(how: str, tmp_path: Path) -> None:
    table = _table()
    path = _written(how, tmp_path, table)

    encodings = _encodings(path)
    delta = {name for name, used in encodings.items() if "DELTA_BINARY_PACKED" in used}
    assert delta == set(INTEGERS) | {"id"}
    wide = {name for name, used in encodings.items() if "DELTA_BYTE_ARRAY" in used}
    assert wide == set(WIDE)
    assert all("PLAIN" in encodings[name] for name in set(OTHERS) - {"id"})
    assert pq.read_table(path).equals(table)
    con = duckdb_connection()
    assert con.execute(f"SELECT * FROM read_parquet('{path}')").to_arrow_table().to_pylist() == (
        pq.read_table(path).to_pylist()
    )


def test_decimals_stored_as_bytes_are_not_delta_encoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(writer.PARQUET_OPTIONS, "store_decimal_as_integer", False)
    table = _table()
    path = _written("write_table", tmp_path, table)

    encodings = _encodings(path)
    assert "DELTA_BINARY_PACKED" not in encodings["price"] | encodings["amount"]
    assert "DELTA_BINARY_PACKED" in encodings["big"]
    assert pq.read_table(path).equals(table)


def test_an_empty_file_reads_back_with_its_schema(tmp_path: Path) -> None:
    table = _table()
    size = writer.write_empty(str(tmp_path / "e.parquet"), table.schema)

    assert size == (tmp_path / "e.parquet").stat().st_size
    assert pq.read_table(tmp_path / "e.parquet").equals(table.schema.empty_table())


def test_the_encoding_is_the_one_of_the_config_whose_path_holds_the_file(tmp_path: Path) -> None:
    lakes.register("plain", ("s3a://enc-bucket/lake", "s3a://enc-bucket/lake/_staging"))
    lakes.register("delta", ("s3://enc-bucket/lake/inner", f"file://{tmp_path}"))
    lakes.register("plain", (str(tmp_path / "plain"), str(tmp_path / "plain" / "_staging")))

    assert lakes.integer_encoding("s3://enc-bucket/lake/db/t/data/f.parquet") == "plain"
    assert lakes.integer_encoding("s3a://enc-bucket/lake/_staging/r/f.parquet") == "plain"
    assert lakes.integer_encoding("s3://enc-bucket/lake/inner/db/t/f.parquet") == "delta"
    assert lakes.integer_encoding("s3://enc-bucket/lakehouse/f.parquet") == "delta"
    assert lakes.integer_encoding(f"file://{tmp_path}/plain/db/t/f.parquet") == "plain"
    assert lakes.integer_encoding(str(tmp_path / "run" / "f.parquet")) == "delta"  # a staging

    table = _table()
    writer.write_table(str(tmp_path / "plain" / "f.parquet"), table)
    assert not any(
        "DELTA_BINARY_PACKED" in e for e in _encodings(tmp_path / "plain" / "f.parquet").values()
    )
