"""pyiceberg's Avro reads, converting each file schema once, not once per file.

Every manifest list and manifest pyiceberg (0.12) opens starts the same way: the Avro schema in
the file's header (a JSON text) is converted to an Iceberg schema
(``AvroFileHeader.get_schema``), then a reader tree is resolved from that schema and the schema
pyiceberg reads with (``resolve_reader``). For a small table's manifest that is about 85% of
reading it (2.6 ms of 3; a manifest list, 1.5 ms), and one version's publish opens each of the
table's manifests several times: to list the current files, in pyiceberg's overwrite, and in
retention's expiry. Where many tables each changed a little, those conversions were close to
half of publish's CPU (docs/performance.md, "Many small tables").

Both are pure functions of their inputs, and the inputs repeat: the tables' manifests share a
handful of schemas (one per format version and partition type). So `remember_avro_schemas`
remembers the Iceberg schema per header text, and the reader per (file schema, read schema,
struct and enum types). What is remembered is immutable: pyiceberg's schemas are frozen models,
and its readers are ``Singleton`` objects, shared by design, which keep no state between
reads (each read takes its decoder as an argument). Each memory is bounded (`_KEPT`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyiceberg.avro import file as avro_file
from pyiceberg.typedef import EMPTY_DICT

#: Entries each memory keeps; a full one starts again empty (a process reads few schemas).
_KEPT = 256


def remember_avro_schemas() -> None:
    """Remember pyiceberg's Avro header schemas and readers (module docstring). Idempotent."""
    header = avro_file.AvroFileHeader
    if not getattr(header.get_schema, "remembered", False):
        setattr(header, "get_schema", _schema_per_text(header.get_schema))  # noqa: B010
    if not getattr(avro_file.resolve_reader, "remembered", False):
        setattr(avro_file, "resolve_reader", _reader_per_schemas(avro_file.resolve_reader))  # noqa: B010


def _schema_per_text(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``AvroFileHeader.get_schema``, converting each header's schema text once."""
    known: dict[str, Any] = {}

    def get_schema(self: Any) -> Any:
        text = self.meta.get(avro_file._SCHEMA_KEY)
        if not isinstance(text, str):  # no schema: the original raises its error
            return convert(self)
        try:
            return known[text]
        except KeyError:
            if len(known) >= _KEPT:
                known.clear()
            schema = known[text] = convert(self)
            return schema

    get_schema.remembered = True  # type: ignore[attr-defined]
    get_schema.__wrapped__ = convert  # type: ignore[attr-defined]
    return get_schema


def _reader_per_schemas(resolve: Callable[..., Any]) -> Callable[..., Any]:
    """``resolve_reader``, resolving each (file schema, read schema, types) once. The schemas are
    told apart by identity, which `_schema_per_text` makes stable for a file schema; each entry
    holds its schemas, so an identity is never reused while it is remembered."""
    known: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}

    def resolve_reader(
        file_schema: Any,
        read_schema: Any,
        read_types: dict[int, Any] = EMPTY_DICT,
        read_enums: dict[int, Any] = EMPTY_DICT,
    ) -> Any:
        try:
            key = (id(file_schema), id(read_schema), *read_types.items(), None, *read_enums.items())
            return known[key][0]
        except TypeError:  # a type that cannot be a key: resolved every time, as before
            return resolve(file_schema, read_schema, read_types, read_enums)
        except KeyError:
            if len(known) >= _KEPT:
                known.clear()
            reader = resolve(file_schema, read_schema, read_types, read_enums)
            known[key] = (reader, file_schema, read_schema)
            return reader

    resolve_reader.remembered = True  # type: ignore[attr-defined]
    resolve_reader.__wrapped__ = resolve  # type: ignore[attr-defined]
    return resolve_reader
