"""Files' bytes kept in memory by name, within a limit: for files whose bytes never change under
their name, read more than once by a process (`orchestrator.lake.storage.open_parquet`'s small
Parquet files on an object store, `orchestrator.lake.iceberg_io`'s Iceberg metadata files).

>>> kept = KeptBytes(8)
>>> kept.put("a", b"aaaa"); kept.put("b", b"bbbb"); kept.put("c", b"cc")  # a goes
>>> kept.names(), kept.get("a")
(['b', 'c'], None)
"""

from __future__ import annotations

import threading

import pyarrow as pa


class KeptBytes:
    """Files' bytes kept in memory by name, at most ``limit`` bytes in all, the least recently
    used dropped first (a file above the limit is not kept). For files whose bytes never change
    under their name."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._files: dict[str, bytes | pa.Buffer] = {}  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, name: str) -> bytes | pa.Buffer | None:
        with self._lock:
            data = self._files.pop(name, None)
            if data is not None:
                self._files[name] = data
            return data

    def put(self, name: str, data: bytes | pa.Buffer) -> None:
        size = len(data) if isinstance(data, bytes) else data.size
        if size > self.limit:
            return
        with self._lock:
            self._drop(name)
            self._files[name] = data
            self._bytes += size
            while self._bytes > self.limit:
                self._drop(next(iter(self._files)))

    def forget(self, name: str) -> None:
        with self._lock:
            self._drop(name)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._files)

    def _drop(self, name: str) -> None:
        data = self._files.pop(name, None)
        if data is not None:
            self._bytes -= len(data) if isinstance(data, bytes) else data.size
