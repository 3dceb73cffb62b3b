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

Iceberg's metadata files (metadata JSON, manifest lists, manifests) are never changed once
written, and each name is new (a UUID in it): this FileIO reads each one once per process and
keeps its bytes (`orchestrator.lake.kept_bytes`, at most `KEPT_BYTES`). pyiceberg's commit of a
version reads the parent snapshot's manifest list and manifests three times each, two requests a
read on S3. On S3 a file it writes knows its length (no request for it), and one that must not
replace another is looked for with one request, not pyarrow's two.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from types import TracebackType
from typing import Any, Self

from pyiceberg.io import InputStream, OutputStream
from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

from orchestrator.config import objectstore
from orchestrator.lake import storage
from orchestrator.lake.kept_bytes import KeptBytes

#: The ``py-io-impl`` naming this module's FileIO.
DURABLE_FILE_IO = f"{__name__}.DurableFileIO"
#: How a metadata file's name ends (``00001-<uuid>.metadata.json``, compressed:
#: ``.gz.metadata.json``).
METADATA_SUFFIX = ".metadata.json"

# pyiceberg logs at INFO each time it loads a FileIO named by py-io-impl: once per table loaded.
logging.getLogger("pyiceberg.io").addFilter(
    lambda record: not (record.levelno == logging.INFO and DURABLE_FILE_IO in record.getMessage())
)

# pyiceberg warns of each column without statistics when it lists a file: every column of an empty
# table's one file (no values, no bounds), each time its version is published. The file is listed
# without those bounds, as it should be; the warning told a user of nothing to do.
logging.getLogger("pyiceberg.io.pyarrow").addFilter(
    lambda record: record.msg != "PyArrow statistics missing for column %d when writing file"
)

_dirty: set[str] = set()  # directories with a file closed since they were last synced
_dirty_lock = threading.Lock()


#: Bytes of Iceberg metadata files a process keeps (`_kept`): the least recently read go first.
KEPT_BYTES = 64 * 1024 * 1024


class DurableFileIO(PyArrowFileIO):
    """`PyArrowFileIO` whose local output files are on disk (with their names) before a commit,
    and which reads each Iceberg metadata file once per process."""

    def new_input(self, location: str) -> PyArrowFile:
        found = super().new_input(location)
        if not _never_changes(location):
            return found
        return _KeptFile(
            location=location,
            path=found._path,
            fs=found._filesystem,
            buffer_size=found._buffer_size,
        )

    def new_output(self, location: str) -> PyArrowFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        buffer_size = int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE))
        if objectstore.is_s3(location):
            fs, key = storage.filesystem(location)
            return _S3File(location=location, path=key, fs=fs, buffer_size=buffer_size)
        if scheme != "file":
            return super().new_output(location)
        return _DurableFile(
            location=location,
            path=path,
            fs=self.fs_by_scheme(scheme, netloc),
            buffer_size=buffer_size,
        )


def _never_changes(location: str) -> bool:
    """Whether ``location`` names an Iceberg metadata file: a metadata JSON, a manifest list or a
    manifest, written once under a new name (``version-hint.text`` of a Hadoop table is
    replaced in place: not one of them).

    >>> _never_changes("s3://b/t/metadata/00002-1f0e.metadata.json"), _never_changes(
    ...     "/l/t/metadata/snap-1-0-9a.avro"), _never_changes("/l/t/metadata/version-hint.text")
    (True, True, False)
    """
    return location.endswith((".avro", METADATA_SUFFIX))


_kept = KeptBytes(KEPT_BYTES)


class _KeptFile(PyArrowFile):
    """An Iceberg metadata file, read from the store once per process (`_kept`)."""

    def _bytes(self) -> bytes:
        data = _kept.get(self.location)
        if data is None:
            with super().open(seekable=False) as stream:
                data = stream.read()
            _kept.put(self.location, data)
        return bytes(data)

    def __len__(self) -> int:
        return len(self._bytes())

    def exists(self) -> bool:
        return _kept.get(self.location) is not None or super().exists()

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._bytes())


class _S3File(PyArrowFile):
    """A file on S3 written through `storage.filesystem`'s store, whose length, once written, is
    the bytes written (pyiceberg asks it of each manifest it writes)."""

    _written: int | None = None

    def create(self, overwrite: bool = False) -> OutputStream:
        if not overwrite and storage.file_exists(self.location):
            raise FileExistsError(f"Cannot create file, already exists: {self.location}")
        return _Counted(self._filesystem.open_output_stream(self._path), self)

    def __len__(self) -> int:
        return self._written if self._written is not None else super().__len__()


class _Wrapped:
    """An output stream around another: `close` when a ``with`` block ends well, `abandon` when
    it raises (its error is the one raised); what else is asked of it, the stream underneath
    answers (``tell``, ``flush`` ...)."""

    def __init__(self, stream: OutputStream) -> None:
        self._stream = stream

    def write(self, b: bytes) -> int:
        return self._stream.write(b)

    def close(self) -> None:
        self._stream.close()

    def abandon(self) -> None:
        self._stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Counted(_Wrapped):
    """An output stream that tells its `_S3File` how many bytes it wrote, once closed (not when
    a write failed: no length is known then)."""

    def __init__(self, stream: OutputStream, file: _S3File) -> None:
        super().__init__(stream)
        self._file = file
        self._count = 0

    def write(self, b: bytes) -> int:
        self._count += len(b)
        return super().write(b)

    def close(self) -> None:
        super().close()
        self._file._written = self._count


class _DurableFile(PyArrowFile):
    def create(self, overwrite: bool = False) -> OutputStream:
        storage.makedirs_durable(os.path.dirname(self._path))  # metadata/ of a new table
        return _Synced(super().create(overwrite), self._path)


class _Synced(_Wrapped):
    """An output stream that, once closed, is on disk; a metadata file's close also syncs the
    directories of every file closed before it (their names). A failed write is not synced:
    nothing will commit it."""

    def __init__(self, stream: OutputStream, path: str) -> None:
        super().__init__(stream)
        self._path = path
        self._closed = False

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

    def abandon(self) -> None:
        self._closed = True
        self._stream.close()
