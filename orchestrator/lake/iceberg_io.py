"""The FileIO Tidemark's catalog writes Iceberg files with: pyiceberg's `PyArrowFileIO`, whose
local files are on disk before a catalog commit can name them, and whose files on S3 are each
one request.

A catalog commit makes a metadata file current, and that file names the manifest list and the
manifests written just before it. On a local or NFS lake those were only in the kernel's page
cache at the commit (written back within about 30 s): a power cut in between left a committed
snapshot naming an empty file. Each local file this FileIO writes is fsynced when closed; the
directories that got new files are synced when a metadata file closes, the last file written
before a commit (one directory sync a commit, not one a file; the files of a commit may come
through several FileIO instances and pyiceberg's writer threads, so the directories are kept
per process). A file on S3 is written through `storage.filesystem`'s store for its bucket
(``output.s3``'s settings): sent in one PUT when it is closed, where pyiceberg's own store
opens a multipart upload first (three requests for each small manifest and metadata file; an
object store's PUT is durable when acknowledged). Other schemes are written as `PyArrowFileIO`
writes them. `iceberg.catalog_properties` names this class as ``py-io-impl`` for a local or S3
lake whose catalog writes its metadata files in the client (not REST), unless the catalog's
properties name a FileIO of their own. The publish step makes the data files durable
(`VersionWriter.sync`) before it commits them.
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType
from typing import Any

from pyiceberg.io import OutputStream
from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

from orchestrator.config import objectstore
from orchestrator.lake import storage

#: The ``py-io-impl`` naming this module's FileIO.
DURABLE_FILE_IO = f"{__name__}.DurableFileIO"
#: How a metadata file's name ends (``00001-<uuid>.metadata.json``, compressed:
#: ``.gz.metadata.json``).
METADATA_SUFFIX = ".metadata.json"

# pyiceberg logs at INFO each time it loads a FileIO named by py-io-impl: once per table loaded.
logging.getLogger("pyiceberg.io").addFilter(
    lambda record: not (record.levelno == logging.INFO and DURABLE_FILE_IO in record.getMessage())
)

_dirty: set[str] = set()  # directories with a file closed since they were last synced
_dirty_lock = threading.Lock()


class DurableFileIO(PyArrowFileIO):
    """`PyArrowFileIO` whose local output files are on disk (with their names) before a commit."""

    def new_output(self, location: str) -> PyArrowFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        buffer_size = int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE))
        if objectstore.is_s3(location):
            fs, key = storage.filesystem(location)
            return PyArrowFile(location=location, path=key, fs=fs, buffer_size=buffer_size)
        if scheme != "file":
            return super().new_output(location)
        return _DurableFile(
            location=location,
            path=path,
            fs=self.fs_by_scheme(scheme, netloc),
            buffer_size=buffer_size,
        )


class _DurableFile(PyArrowFile):
    def create(self, overwrite: bool = False) -> OutputStream:
        storage.makedirs_durable(os.path.dirname(self._path))  # metadata/ of a new table
        return _Synced(super().create(overwrite), self._path)


class _Synced:
    """An output stream that, once closed, is on disk; a metadata file's close also syncs the
    directories of every file closed before it (their names)."""

    def __init__(self, stream: OutputStream, path: str) -> None:
        self._stream = stream
        self._path = path
        self._closed = False

    def write(self, b: bytes) -> int:
        return self._stream.write(b)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stream.close()
        storage.sync([self._path])
        with _dirty_lock:
            _dirty.add(os.path.dirname(self._path))
            if not self._path.endswith(METADATA_SUFFIX):
                return
            directories = sorted(_dirty)
            _dirty.clear()
        storage.sync(directories)

    def __enter__(self) -> _Synced:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # a failed write is not synced: nothing will commit it, and its error is the one
            # raised
            self._closed = True
            self._stream.close()

    def __getattr__(self, name: str) -> Any:  # tell(), flush() ... of the stream underneath
        return getattr(self._stream, name)
