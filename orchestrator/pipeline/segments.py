"""The capture's staged change segments: naming, listing, atomic writes, resume.

A table's changes are numbered segments under the run's staging::

    <staging>/<run_id>/changes/<db>.<table>/seg-000001.parquet

Segment numbers run across the whole run; the capture checkpoint records the
highest durable one (see `orchestrator.pipeline.capture`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.lake import storage
from orchestrator.positions import BinlogPosition
from orchestrator.state.store import StateStore

log = logging.getLogger("orchestrator.pipeline.capture")

SEGMENT = re.compile(r"^seg-(\d{6,})\.parquet$")


def segment_name(number: int) -> str:
    """The file name of segment ``number``.

    >>> segment_name(12)
    'seg-000012.parquet'
    """
    return f"seg-{number:06d}.parquet"


def _segments(fs: pafs.FileSystem, directory: str) -> list[tuple[int, str, str]]:
    """``(number, table, path)`` of every segment under ``directory``, in number order."""
    found = []
    for info in fs.get_file_info(pafs.FileSelector(directory, recursive=True, allow_not_found=True)):
        match = SEGMENT.match(info.base_name)
        if info.type == pafs.FileType.File and match:
            table = info.path.rstrip("/").rsplit("/", 2)[-2]
            found.append((int(match.group(1)), table, info.path))
    return sorted(found)


def segment_paths(staging: str, run_id: str, table: str) -> list[str]:
    """The paths (within the staging filesystem) of a table's segments, in number order."""
    fs, root = storage.filesystem(staging)
    return [p for _, t, p in _segments(fs, f"{root}/{run_id}/changes") if t == table]


def read_changes(staging: str, run_id: str, table: str) -> pa.Table:
    """All of a table's captured changes in segment order (an empty table if there are none)."""
    fs, root = storage.filesystem(staging)
    parts = [pq.read_table(p, filesystem=fs) for n, t, p in _segments(fs, f"{root}/{run_id}/changes")
             if t == table]
    return pa.concat_tables(parts) if parts else pa.table({})


def write_segment(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write a Parquet file under a temporary name and rename it into place."""
    directory, _, name = path.rpartition("/")
    fs.create_dir(directory, recursive=True)
    temp = f"{directory}/.{name}.tmp"
    if isinstance(fs, pafs.LocalFileSystem):
        with open(temp, "wb") as out:
            pq.write_table(table, out)
            out.flush()
            os.fsync(out.fileno())
    else:
        pq.write_table(table, temp, filesystem=fs)
    fs.move(temp, path)


def resume_point(store: StateStore, run_id: str, fs: pafs.FileSystem, root: str
                  ) -> tuple[BinlogPosition | None, int, dict[str, int]]:
    """The run's checkpoint (position, segments) and rows per table in durable segments.

    Segments numbered above the checkpoint, and temporary files, are deleted.
    """
    saved = store.capture_checkpoint(run_id)
    position = BinlogPosition.from_json(saved["position"]) if saved else None
    durable = int(saved["segments"]) if saved else 0
    directory = f"{root}/{run_id}/changes"
    rows: dict[str, int] = {}
    for number, table, path in _segments(fs, directory):
        if number > durable:
            log.info("capture %s: deleting %s, written after the last checkpoint", run_id, path)
            fs.delete_file(path)
        else:
            rows[table] = rows.get(table, 0) + storage.parquet_rows(path, fs)
    for info in fs.get_file_info(pafs.FileSelector(directory, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File and info.base_name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(info.path)
    return position, durable, rows


def drop_segments(staging: str, run_id: str, table: str) -> None:
    """Delete a table's change segments of the run (its rows are read again)."""
    fs, _ = storage.filesystem(staging)
    for path in segment_paths(staging, run_id, table):
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(path)
