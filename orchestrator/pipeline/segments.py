"""The capture's staged change segments: naming, listing, atomic writes, resume.

A table's changes are numbered segments under the run's staging::

    <staging>/<run_id>/changes/<db>.<table>/seg-000001-<writer>.parquet

Segment numbers run across the whole run. ``writer`` is a tag unique to one capture
attempt (`storage.attempt_tag`). The capture checkpoint records the highest durable
number and, per attempt, the first number it wrote (``owners``, `owner_of`): a segment is
durable when its number is at most the checkpoint's and its file carries the tag of the
attempt that owns that number. Files of any other attempt - one that crashed before its
checkpoint, or one that lost the pipeline lock and wrote on - are never read, and no
capture deletes them: a deleter whose view of the checkpoint is stale would delete the
new owner's durable segments. They go with the run's staging when the run ends.

A table's segments before its re-read are voided in state (``segments_after`` in its
run-table info, `void_mark`), in the transaction that plans it again, never deleted.
Segments written before the state schema recorded owners have no tag (owner ``""``).
`CaptureResult` is what a capture left in staging.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.config.patterns import listed
from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.positions import BinlogPosition
from orchestrator.state.store import StateStore

SEGMENT = re.compile(r"^seg-(\d{6,})(?:-([0-9a-f]+))?\.parquet$")


def segment_name(number: int, writer: str = "") -> str:
    """The file name of segment ``number`` written by ``writer``.

    >>> segment_name(12, "a1b2c3d4"), segment_name(12)
    ('seg-000012-a1b2c3d4.parquet', 'seg-000012.parquet')
    """
    return f"seg-{number:06d}-{writer}.parquet" if writer else f"seg-{number:06d}.parquet"


def owner_of(owners: Sequence[Sequence[object]], number: int) -> str | None:
    """The writer of segment ``number``: the last ``[writer, first]`` with ``first <= number``.

    >>> owner_of([["", 1], ["a1", 4], ["b2", 9]], 5), owner_of([["a1", 4]], 3)
    ('a1', None)
    """
    found = None
    for writer, first in owners:
        if int(str(first)) <= number:
            found = str(writer)
    return found


def _segments(fs: pafs.FileSystem, directory: str) -> list[tuple[int, str, str, str, int]]:
    """``(number, writer, table, path, bytes)`` of every segment file under ``directory``, by
    number."""
    found = []
    for info in fs.get_file_info(
        pafs.FileSelector(directory, recursive=True, allow_not_found=True)
    ):
        match = SEGMENT.match(info.base_name)
        if info.type == pafs.FileType.File and match:
            table = info.path.rstrip("/").rsplit("/", 2)[-2]
            found.append(
                (int(match.group(1)), match.group(2) or "", table, info.path, info.size or 0)
            )
    return sorted(found)


def _durable(
    fs: pafs.FileSystem, directory: str, segments: int, owners: Sequence[Sequence[object]]
) -> list[tuple[int, str, str, int]]:
    """``(number, table, path, bytes)`` of the durable segments; a RunFailed naming a missing
    one."""
    found = [
        (n, t, p, size)
        for n, w, t, p, size in _segments(fs, directory)
        if n <= segments and w == owner_of(owners, n)
    ]
    numbers = {n for n, _, _, _ in found}
    missing = [n for n in range(1, segments + 1) if n not in numbers and owner_of(owners, n)]
    if missing:
        raise RunFailed(
            f"the capture checkpoint names change segment {missing[0]} of {directory} "
            f"(written by capture {owner_of(owners, missing[0])}), but it is gone; "
            "reset the run's tables (`tidemark reset --table T --yes`) and run again"
        )
    return found


def voided(store: StateStore, run_id: str) -> dict[str, int]:
    """Per table of the run, the segment number up to which its segments are void (re-read)."""
    return store.segment_marks(run_id)  # tables without a mark: 0


def void_mark(store: StateStore, run_id: str) -> int:
    """The mark that voids every segment captured so far (`voided`): the checkpoint's count."""
    saved = store.capture_checkpoint(run_id)
    return int(saved["segments"]) if saved else 0


@dataclass(frozen=True, slots=True)
class Durable:
    """A run's durable segments (`durable`), voided ones left out: per table, their URIs in
    number order and their bytes in all (from the one listing: no request per file)."""

    files: dict[str, list[str]]
    sizes: dict[str, int]


def durable(store: StateStore, staging: str, run_id: str) -> Durable:
    """The run's `Durable` segments, from one listing of its staging."""
    saved = store.capture_checkpoint(run_id)
    if saved is None:
        return Durable({}, {})
    fs, root = storage.filesystem(staging)
    void = voided(store, run_id)
    found = Durable({}, {})
    for number, table, path, size in _durable(
        fs, f"{root}/{run_id}/changes", int(saved["segments"]), saved["owners"]
    ):
        if number > void.get(table, 0):
            found.files.setdefault(table, []).append(
                storage.join(staging, run_id, "changes", table, path.rsplit("/", 1)[1])
            )
            found.sizes[table] = found.sizes.get(table, 0) + size
    return found


def durable_segments(store: StateStore, staging: str, run_id: str) -> dict[str, list[str]]:
    """Per table, the URIs of its durable segments of the run in number order, voided ones left
    out (`durable`)."""
    return durable(store, staging, run_id).files


#: A table's change segments: the files (the run's durable ones, `segment_paths`), or a directory
#: all of whose Parquet files are changes (tests and library use).
Changes = str | Sequence[str]


def segment_files(changes: Changes) -> list[str]:
    """The change segment files ``changes`` names (a directory that does not exist has none)."""
    return (
        storage.list_files(changes, suffix=".parquet")
        if isinstance(changes, str)
        else list(changes)
    )


def segment_paths(store: StateStore, staging: str, run_id: str, table: str) -> list[str]:
    """The URIs of a table's durable segments, in number order."""
    return durable_segments(store, staging, run_id).get(table, [])


def read_changes(store: StateStore, staging: str, run_id: str, table: str) -> pa.Table:
    """All of a table's captured changes in segment order (an empty table if there are none)."""
    parts = []
    for uri in segment_paths(store, staging, run_id, table):
        fs, path = storage.filesystem(uri)
        parts.append(pq.read_table(path, filesystem=fs))
    return pa.concat_tables(parts) if parts else pa.table({})


#: How segments are encoded: written once and read once, by the same run. zstd at level 1
#: without dictionary pages writes 100,000 changed rows in 27 ms and reads them in 13 ms where
#: pyarrow's default (snappy, dictionaries) took 42 and 51 ms, in half the bytes; Spark reads it.
SEGMENT_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "use_dictionary": False,
}


def write_segment(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write a Parquet file under a temporary name and rename it into place (on an object store
    straight to its name: an object is seen whole or not at all, and a rename there is a copy, a
    delete and a marker object for the emptied directory); the table is kept in memory for this
    process's reconcile (`keep`)."""
    storage.parent_made(fs, path)
    if isinstance(fs, pafs.S3FileSystem):
        pq.write_table(table, path, filesystem=fs, **SEGMENT_OPTIONS)
    else:
        directory, _, name = path.rpartition("/")
        temp = f"{directory}/.{name}.tmp"
        if isinstance(fs, pafs.LocalFileSystem):
            with open(temp, "wb") as out:
                pq.write_table(table, out, **SEGMENT_OPTIONS)
                out.flush()
                os.fsync(out.fileno())
        else:
            pq.write_table(table, temp, filesystem=fs, **SEGMENT_OPTIONS)
        fs.move(temp, path)
    keep(path, table)


# --------------------------------------------------------------------------- kept in memory

#: The segments a process wrote are kept in memory, up to this many bytes, for its own
#: reconcile (`taken`): `tidemark run` captures and reconciles in one process, which then reads
#: back no segment it wrote (1M changes of shop.orders: 0.2-0.5 s of Parquet decoding). A
#: segment's name is unique to the capture attempt that wrote it, so the table kept under its
#: path is the file's content; reconcile still checks the file is there with the same schema.
#: Segments past the bound are read from their files, as a step in another process reads all.
KEEP_BYTES = 256 * 2**20
_kept: dict[str, tuple[pa.Table, int]] = {}  # path -> (table, its bytes)
_kept_bytes = 0
_kept_lock = threading.Lock()


def keep(path: str, table: pa.Table) -> None:
    """Keep segment ``path``'s table in memory while the kept ones stay under `KEEP_BYTES`."""
    global _kept_bytes
    size = table.nbytes
    with _kept_lock:
        _kept_bytes -= _kept.pop(path, (None, 0))[1]  # a path written again: its new table
        if _kept_bytes + size <= KEEP_BYTES:
            _kept[path] = (table, size)
            _kept_bytes += size


def taken(path: str) -> pa.Table | None:
    """Segment ``path``'s table if this process kept it (`keep`), no longer kept."""
    global _kept_bytes
    with _kept_lock:
        table, size = _kept.pop(path, (None, 0))
        _kept_bytes -= size
        return table


def forget() -> None:
    """Drop every kept segment: a capture starting, a reconcile done."""
    global _kept_bytes
    with _kept_lock:
        _kept.clear()
        _kept_bytes = 0


def resume_point(
    store: StateStore, run_id: str, fs: pafs.FileSystem, root: str
) -> tuple[BinlogPosition | None, int, dict[str, int], list[list[object]]]:
    """The run's checkpoint (position, segments), rows per table in its durable segments (voided
    ones left out) and the owners of the segment numbers. Deletes nothing (module docstring)."""
    saved = store.capture_checkpoint(run_id)
    if saved is None:
        return None, 0, {}, []
    count, owners = int(saved["segments"]), saved["owners"]
    void = voided(store, run_id)
    rows: dict[str, int] = {}
    for number, table, path, _ in _durable(fs, f"{root}/{run_id}/changes", count, owners):
        if number > void.get(table, 0):
            rows[table] = rows.get(table, 0) + storage.parquet_rows(path, fs)
    return BinlogPosition.from_json(saved["position"]), count, rows, owners


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """What a capture left in staging.

    Attributes:
        rows: changes per table in the run's durable segments (all of them, resumes included).
        segments: the highest durable segment number.
        end: the position everything up to which is captured (the stop position).
        resumed: whether this call continued from a checkpoint.
        seconds: how long this call took.
    """

    rows: dict[str, int]
    segments: int
    end: BinlogPosition
    resumed: bool = False
    seconds: float = 0.0

    def __str__(self) -> str:
        """The changes of the tables that have any (the first few), and how many have none.

        >>> print(CaptureResult({"a.t": 3, "a.u": 0, "a.v": 0}, 1, BinlogPosition("b.000001", 4)))
        3 changes up to b.000001:4 (a.t 3; 2 table(s) without change; 1 segments, 0.0s)
        """
        changed = sorted((t, n) for t, n in self.rows.items() if n)
        unchanged = len(self.rows) - len(changed)
        per_table = listed([f"{t} {n}" for t, n in changed]) if changed else ""
        if unchanged:
            per_table += ("; " if per_table else "") + f"{unchanged} table(s) without change"
        per_table = per_table or "no tables"
        how = "resumed, " if self.resumed else ""
        return (
            f"{sum(self.rows.values())} changes up to {self.end} ({per_table}; {how}"
            f"{self.segments} segments, {self.seconds:.1f}s)"
        )
