"""A version's files put in place before its Iceberg commit: the data files reconcile finished in
staging moved into the table's ``data/`` under the version's names (`place`, `moved_tag`), and
the pending manifests of a publish attempt written in the run's staging (`write_pending`), which a
rerun finds when a crash came between the commit and the switch. Names are drawn per attempt
(`fresh_attempt`): an attempt never replaces another's files.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, resnapshot_hint
from orchestrator.lake import layout, storage
from orchestrator.lake.layout import FileRange
from orchestrator.lake.manifest import Manifest, pending_json
from orchestrator.lake.writer import (
    FIELD_ID,
    VersionWriter,
    data_file,
    read_published,
    write_files,
)
from orchestrator.pipeline.context import run_dir
from orchestrator.services import faults

log = logging.getLogger("orchestrator.pipeline.publish.versions")


def fresh_attempt(config: PipelineConfig, run_id: str) -> str:
    """A publish attempt's tag (`storage.attempt_tag`) no earlier attempt of the run wrote
    pending manifests under: another group's file is never replaced, whatever the odds."""
    while True:
        attempt = storage.attempt_tag()
        if not storage.file_exists(pending_file(config, run_id, attempt)):
            return attempt


def pending_file(config: PipelineConfig, run_id: str, attempt: str) -> str:
    """The manifests publish attempt ``attempt`` wrote before its Iceberg commits, by table."""
    return run_dir(config, run_id, "pending", f"{attempt}.json")


def write_pending(
    config: PipelineConfig,
    run_id: str,
    attempt: Callable[[], str],
    manifests: Mapping[str, Manifest],
    guard: Callable[[], None],
) -> None:
    """The staged versions' manifests, by table, in one file, durable before any of them is
    committed: a rerun that finds a commit of the run switches to its manifest
    (`orchestrator.pipeline.publish.versions`, ``_committed_manifest``)."""
    if not manifests:
        return
    guard()
    storage.write_atomic(pending_file(config, run_id, attempt()), pending_json(dict(manifests)))


def moved_tag(reconciled_dir: str) -> str:
    """The tag in the names of the data files moved out of ``reconciled_dir``: the same for every
    publish attempt of that directory (a move a crash cut is finished, not repeated), another for
    each reconcile attempt (whose directory is unique to it:
    `orchestrator.pipeline.reconcile.step`).

    >>> directory = "/s/run/reconciled/shop.orders-1a2b3c4d"
    >>> moved_tag(directory) == moved_tag(directory), moved_tag(directory) == moved_tag("/s/other")
    (True, False)
    """
    return hashlib.sha256(reconciled_dir.encode()).hexdigest()[:8]


def place(
    table: str, tdir: str, version: int, plan: layout.VersionPlan, writer: VersionWriter, tag: str
) -> list[FileRange]:
    """The version's files in key order: shared files listed again, every new file moved from
    staging into ``data/`` under the version's name (a file whose field IDs or types are not
    ``schema``'s, the Iceberg table's, is written anew instead). A file already moved by an
    earlier attempt of this publish (its staging file gone) is taken as it is: every attempt
    names the files with ``tag``, the reconcile attempt's (`moved_tag`)."""
    out: list[FileRange] = []
    index, shape = 0, _shape(writer.schema)
    for entry in plan.files:
        if entry["shared"]:
            out.append(layout.as_range(entry, entry["file"], entry["bytes"]))
            continue
        relative = data_file(version, index, tag)
        index += 1
        writer.files_written = index
        target = storage.join(tdir, relative)
        nbytes = entry["bytes"]  # the file's, as it was written: it moves as it is
        footer = _footer_if_there(entry["file"])
        if footer is not None:
            if _shape(footer.schema.to_arrow_schema()) == shape:
                storage.adopt(entry["file"], target)
                storage.keep_footer(target, footer, nbytes)  # for the Iceberg commit
            else:
                log.warning(
                    "%s: written with other field IDs or types than the Iceberg table's; "
                    "rewriting it",
                    entry["file"],
                )
                write_files(
                    tdir,
                    _named(relative),
                    writer.schema,
                    writer.key,
                    read_published(entry["file"], writer.schema),
                    0,
                    0,
                )
                nbytes = storage.size(target)
        elif not storage.file_exists(target):
            raise RunFailed(
                f"table {table}: {entry['file']}, a data file of the reconciled table, is gone; "
                + resnapshot_hint(table)
            )
        faults.point("publish.file_moved")
        out.append(layout.as_range(entry, relative, nbytes))
    return out


def _footer_if_there(uri: str) -> pq.FileMetaData | None:
    """A staging file's footer (`storage.parquet_footer`), None when the file is gone."""
    try:
        return storage.parquet_footer(uri)
    except FileNotFoundError:
        return None


def _named(relative: str) -> Callable[[int], str]:
    return lambda _: relative


def _shape(schema: pa.Schema) -> list[tuple[str, pa.DataType, bool, bytes | None]]:
    """What a data file must share with the Iceberg table: names, types, nullability, field IDs."""
    return [(f.name, f.type, f.nullable, (f.metadata or {}).get(FIELD_ID)) for f in schema]
