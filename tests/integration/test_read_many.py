"""Many small tables of one shape read by one Spark job (`orchestrator.pipeline.jdbc_many`)
write the same files as a job per table: every type of the type mapping, value for value."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestrator.demo.localdb import LocalMariaDB
from orchestrator.errors import RunFailed
from orchestrator.lake import iceberg
from orchestrator.lake.manifest import published_schema
from orchestrator.pipeline.jdbc import read_chunks
from orchestrator.pipeline.jdbc_many import TableRead, groups, read_group, shape
from orchestrator.pipeline.read import _BatchRead, _ChunkPaths
from orchestrator.schema.tables import TableInfo
from orchestrator.source.connection import Source
from orchestrator.state.records import ChunkRecord
from tests.integration.test_read import DB, ROWS, _config, create_reader, create_types_table

pytestmark = pytest.mark.integration

#: The copies of ``spk_read.types`` and the ids each holds (a table may be empty).
COPIES = {"types_a": "id <= 3", "types_b": "id > 3", "types_c": "FALSE", "types_d": "TRUE"}


@pytest.fixture(scope="module")
def copies(mariadb: LocalMariaDB) -> list[TableInfo]:
    create_reader(mariadb)
    create_types_table(mariadb)
    for name, where in COPIES.items():
        mariadb.execute(f"CREATE TABLE {name} LIKE types", f"INSERT INTO {name} SELECT * FROM types WHERE {where}",
                        database=DB)
    with Source.from_pipeline(_config(Path("/nonexistent"), mariadb, "root", "")) as source:
        return [source.table_info(f"{DB}.{name}") for name in COPIES]


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.parquet"))


def test_one_job_writes_what_a_job_per_table_writes(spark: Any, mariadb: LocalMariaDB, copies: list[TableInfo],
                                                   tmp_path: Path) -> None:
    config = _config(tmp_path, mariadb)
    schema = iceberg.with_field_ids(published_schema(copies[0].columns),
                                    {c.name: i for i, c in enumerate(copies[0].columns, 1)})
    chunks = [(0, "`id` < 3"), (1, "`id` >= 3")]
    alone, together = tmp_path / "alone", tmp_path / "together"
    for info in copies:
        read_chunks(spark, config, info, chunks, lambda i, t=info.table: str(alone / t / f"c{i}"), ("id",),
                    schema=schema)
    reads = [TableRead(info, [(i, where, str(together / info.table / f"c{i}")) for i, where in chunks])
             for info in copies]
    placed = read_group(spark, config, reads, ("id",), schema, lambda: None)

    assert [[rows for rows, _ in t] for t in placed] == [[2, 1], [0, ROWS - 3], [0, 0], [2, ROWS - 2]]
    for info in copies:
        for i, _ in chunks:
            (single,) = _files(alone / info.table / f"c{i}")
            (grouped,) = _files(together / info.table / f"c{i}")
            # field IDs and types alike; the file's own metadata says who wrote it (an empty chunk
            # but a job's first is written by pyarrow, `jdbc._place_chunks`)
            assert pq.read_schema(grouped).remove_metadata().equals(pq.read_schema(single).remove_metadata(),
                                                                     check_metadata=True), info.table
            assert pq.read_table(grouped).equals(pq.read_table(single)), (info.table, i)


def test_a_failed_chunk_fails_the_job_naming_the_group(spark: Any, mariadb: LocalMariaDB,
                                                      copies: list[TableInfo], tmp_path: Path) -> None:
    """The read step then reads the group's tables one by one (`orchestrator.pipeline.read`)."""
    config = _config(tmp_path, mariadb)
    schema = iceberg.data_file_schema(config, copies[0])
    reads = [TableRead(copies[0], [(0, "TRUE", str(tmp_path / "a"))]),
             TableRead(copies[1], [(0, "no_such_column = 1", str(tmp_path / "b"))])]
    with pytest.raises(RunFailed, match=f"2 tables {DB}.types_a .. {DB}.types_b"):
        read_group(spark, config, reads, ("id",), schema, lambda: None)
    assert not (tmp_path / "a").exists()


def test_tables_of_one_shape_are_grouped(copies: list[TableInfo]) -> None:
    schema = iceberg.with_field_ids(published_schema(copies[0].columns),
                                    {c.name: i for i, c in enumerate(copies[0].columns, 1)})
    other = iceberg.with_field_ids(schema, {c.name: i + 1 for i, c in enumerate(copies[0].columns, 1)})
    shapes = {c.name: shape(c, ("id",), schema) for c in copies}
    shapes["x.other_ids"] = shape(copies[0], ("id",), other)
    assert groups(shapes) == [[c.name for c in copies], ["x.other_ids"]]


def test_a_group_that_fails_is_read_table_by_table(spark: Any, mariadb: LocalMariaDB, copies: list[TableInfo],
                                                  tmp_path: Path) -> None:
    """A failure that may be one table's own lands on that table alone: the others are read."""
    config = _config(tmp_path, mariadb)
    blank = ChunkRecord("r", "", 0, 0, None, None, "TRUE", "pending", None, None, None, None, None, 0)
    a, b = copies[0], copies[1]
    by_table = {a.name: [replace(blank, table=a.name)],
                b.name: [replace(blank, table=b.name, where="no_such_column = 1")]}
    schema = iceberg.data_file_schema(config, a)
    reader = _BatchRead(spark, config, by_table, {t.name: (t, ("id",)) for t in (a, b)}, _ChunkPaths(config, "r", "t1"),
                        lambda: None, {a.name: schema, b.name: schema})
    outcomes = reader.together([a.name, b.name])
    assert isinstance(outcomes[b.name], RunFailed) and "no_such_column" in str(outcomes[b.name])
    (read,) = outcomes[a.name]  # type: ignore[misc]
    assert read.rows == 3 and Path(read.path).is_dir()
