"""The capture's segments written in a thread of their own while the capture reads on.

Writing a flush's segments (zstd, fsync, rename) took a sixth of a large capture's time in the
run's process, which frames the stream meanwhile waited; pyarrow writes without the interpreter's
lock, so a thread overlaps it with the reading. One flush is written at a time, in order: a flush
waits for the one before (`SegmentWrites.submit`), so at most two flushes' tables are in memory.
Nothing that depends on a segment being written runs before it is: the capture checkpoint waits
for every submitted write (`SegmentWrites.wait`) and fails with a write's error; the cascade
derivation, which may read back segments written earlier, waits first too. The fence is checked
before a flush's segments are submitted, as before they were written; the failpoint
``capture.flushed`` passes once a flush's segments are written.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from orchestrator.pipeline.segments import write_segment
from orchestrator.services import faults

#: A flush's segments: ``(path, table)`` in the order they are written.
Segments = list[tuple[str, pa.Table]]


class SegmentWrites:
    """A flush's segments written by a thread, one flush at a time."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, segments: Sequence[tuple[str, pa.Table]]) -> None:
        """Write ``(path, table)`` in order, after the writes submitted before are done."""
        self.wait()
        self._thread = threading.Thread(
            target=self._write, args=(list(segments),), name="tidemark-segments"
        )
        self._thread.start()

    def _write(self, segments: Segments) -> None:
        try:
            for path, table in segments:
                write_segment(self.fs, path, table)
            faults.point("capture.flushed")
        except BaseException as exc:  # raised in the capture's thread by `wait`
            self._error = exc

    def wait(self) -> None:
        """Return once every submitted segment is written; raise the error of one that failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
