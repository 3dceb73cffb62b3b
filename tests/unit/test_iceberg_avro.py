"""pyiceberg's Avro reads with each file schema converted once (`orchestrator.lake.iceberg_avro`):
the same manifests and entries as pyiceberg's own conversion reads, from a real table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.avro import file as avro_file
from pyiceberg.manifest import ManifestFile, read_manifest_list

from orchestrator.lake import iceberg, iceberg_avro
from tests.unit.test_iceberg import config_for, publish


def _read(table: Any) -> list[tuple[Any, ...]]:
    """Every manifest list and manifest entry of every snapshot of ``table``, as values."""
    out: list[tuple[Any, ...]] = []
    for snapshot in table.snapshots():
        listed = list(read_manifest_list(table.io.new_input(snapshot.manifest_list)))
        for manifest in listed:
            out.append(
                ("manifest", manifest.manifest_path, manifest.content, manifest.added_files_count)
            )
            for entry in ManifestFile.fetch_manifest_entry(
                manifest, table.io, discard_deleted=False
            ):
                data = entry.data_file
                out.append(
                    (
                        "entry",
                        entry.status,
                        entry.snapshot_id,
                        data.file_path,
                        data.file_format,
                        data.record_count,
                        data.content,
                        dict(data.lower_bounds or {}),
                    )
                )
    return out


def test_manifests_read_with_remembered_schemas_read_as_pyiceberg_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the conversions remembered, each header text is converted once and each schema pair
    resolved once, and every manifest list and entry reads the same values as with pyiceberg's
    own conversion at every file."""
    assert getattr(avro_file.AvroFileHeader.get_schema, "remembered", False)
    assert getattr(avro_file.resolve_reader, "remembered", False)
    config = config_for(tmp_path, keep=5)
    for n in range(1, 5):
        publish(config, tmp_path, n)
    table = iceberg.open_catalog(config).load_table("db.t")

    converted: list[str] = []
    resolved: list[tuple[int, int]] = []
    convert = avro_file.AvroFileHeader.get_schema.__wrapped__  # type: ignore[attr-defined]
    resolve = avro_file.resolve_reader.__wrapped__  # type: ignore[attr-defined]

    def counted_convert(header: Any) -> Any:
        converted.append(header.meta[avro_file._SCHEMA_KEY])
        return convert(header)

    def counted_resolve(file_schema: Any, read_schema: Any, *types: Any) -> Any:
        resolved.append((id(file_schema), id(read_schema)))
        return resolve(file_schema, read_schema, *types)

    monkeypatch.setattr(avro_file.AvroFileHeader, "get_schema", counted_convert)
    monkeypatch.setattr(avro_file, "resolve_reader", counted_resolve)
    plain = _read(table)
    files = len(converted)
    assert files > 8 and len(resolved) == files  # pyiceberg's own: once per file

    converted.clear()
    resolved.clear()
    monkeypatch.setattr(
        avro_file.AvroFileHeader, "get_schema", iceberg_avro._schema_per_text(counted_convert)
    )
    monkeypatch.setattr(
        avro_file, "resolve_reader", iceberg_avro._reader_per_schemas(counted_resolve)
    )
    assert _read(table) == plain
    assert _read(table) == plain
    assert len(converted) == len(set(converted)) == 2, "a manifest list's schema and a manifest's"
    assert len(resolved) == 2


def test_a_full_memory_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each memory keeps at most `_KEPT` entries, and what it gives is what the function gives."""
    monkeypatch.setattr(iceberg_avro, "_KEPT", 2)
    calls: list[str] = []

    class Header:
        def __init__(self, text: str) -> None:
            self.meta = {avro_file._SCHEMA_KEY: text}

    def convert(header: Header) -> str:
        calls.append(header.meta[avro_file._SCHEMA_KEY])
        return "schema of " + header.meta[avro_file._SCHEMA_KEY]

    remembered = iceberg_avro._schema_per_text(convert)
    texts = ["a", "b", "a", "c", "a", "b"]
    assert [remembered(Header(t)) for t in texts] == [f"schema of {t}" for t in texts]
    assert calls == ["a", "b", "c", "a", "b"]  # "c" found the memory full: it started again

    with pytest.raises(KeyError):
        remembered(type("NoSchema", (), {"meta": {}})())  # no schema: the function's own error

    resolved: list[tuple[object, ...]] = []

    def resolve(*args: Any) -> tuple[object, ...]:
        resolved.append(args)
        return args

    reader = iceberg_avro._reader_per_schemas(resolve)
    file_schema, read_schema = object(), object()
    assert reader(file_schema, read_schema, {1: int}) == (file_schema, read_schema, {1: int}, {})
    assert reader(file_schema, read_schema, {1: int}) == (file_schema, read_schema, {1: int}, {})
    assert reader(file_schema, read_schema, {}, {1: int}) == (
        file_schema,
        read_schema,
        {},
        {1: int},
    )
    assert len(resolved) == 2, "the same schemas with other types are resolved apart"
    unhashable = {1: []}
    assert reader(file_schema, read_schema, unhashable)[2] is unhashable
    assert reader(file_schema, read_schema, unhashable)[2] is unhashable
    assert len(resolved) == 4, "a type that cannot be a key is resolved every time"
