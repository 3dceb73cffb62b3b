"""The driver JVM's class-data-sharing archive: Spark's classes loaded from a memory map.

A driver JVM loads and verifies about 15,000 of Spark's classes before its session can run a
job: on this project's machine 5-7 s of a run's start (docs/performance.md). The JVM can save
the classes it loaded into an archive at its exit (``-XX:ArchiveClassesAtExit``, JDK 13+) and
map them from it at the next start (``-XX:SharedArchiveFile``), which roughly halves that time.

`java_options` gives the options for the driver JVM a process is about to launch:

- an archive exists for this JVM and class path (the key: the ``java`` in use, pyspark's
  version and the jars on the class path) → map it;
- none, and no other JVM is writing one → this JVM writes one when it exits, under a name of
  its own (``<key>.<pid>.jsa``), so two JVMs never write the same file;
- otherwise nothing.

Safety rests on the JVM: it writes an archive's header last, so a file cut short (a JVM killed
while writing it) has a header of zeros, which `_complete` refuses and which the JVM would also
ignore; a complete archive made for another class path or JVM is refused by the JVM itself
(``-Xshare:auto``, its default), which then loads classes as usual. A complete archive damaged
afterwards (cut short by a copy or a full disk) can crash the JVM that maps it: the driver's
start (`orchestrator.services.spark.start_jvm`) then removes it and starts the JVM without it.
The archive only changes how classes are loaded, never what the run does.

The archives live in ``$TIDEMARK_JVM_CACHE``, else ``$XDG_CACHE_HOME/tidemark/jvm``, else
``~/.cache/tidemark/jvm``; ``TIDEMARK_JVM_CACHE=off`` turns this off, and so does a
``spark.driver.extraJavaOptions`` that sets class sharing itself. Archives unused for 30 days
are removed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

#: The first four bytes of a complete dynamic archive (``0xf00baba8``, little-endian).
DYNAMIC_MAGIC = bytes.fromhex("a8ab0bf0")

#: The JVM's own class-sharing options: a user who sets one keeps control.
_USER_OPTIONS = ("-Xshare", "-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit")

#: Archives (or leftovers) not used for this long are removed.
_UNUSED_SECONDS = 30 * 24 * 3600

#: How long after its last write an unfinished archive may still be written by its JVM.
_WRITING_SECONDS = 300

#: Quiet: the JVM lists every class it leaves out of an archive at WARNING.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where archives are kept, or None when turned off.

    >>> str(cache_dir({"TIDEMARK_JVM_CACHE": "/var/cache/tm"}))
    '/var/cache/tm'
    >>> cache_dir({"TIDEMARK_JVM_CACHE": "off"}) is None
    True
    >>> str(cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"}))
    '/c/tidemark/jvm'
    """
    chosen = environ.get("TIDEMARK_JVM_CACHE")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "false") else Path(chosen)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "tidemark" / "jvm"


def archive_key(conf: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> str:
    """What an archive is valid for: the ``java`` that runs, pyspark's version, the class path.

    >>> conf = {"spark.driver.extraClassPath": "/j/a.jar"}
    >>> archive_key(conf, {"JAVA_HOME": "/jdk"}) == archive_key(conf, {"JAVA_HOME": "/jdk"})
    True
    >>> archive_key(conf, {"JAVA_HOME": "/jdk"}) == archive_key({}, {"JAVA_HOME": "/jdk"})
    False
    """
    import pyspark

    java_home = environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or ""
    parts = [
        os.path.realpath(java) if java else "",
        pyspark.__version__,
        os.path.dirname(pyspark.__file__),
        conf.get("spark.jars", ""),
        conf.get("spark.driver.extraClassPath", ""),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def java_options(conf: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> str:
    """The class-sharing options for the driver JVM about to start with ``conf`` ("" for none)."""
    if any(o in conf.get("spark.driver.extraJavaOptions", "") for o in _USER_OPTIONS):
        return ""
    directory = cache_dir(environ)
    if directory is None:
        return ""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        key = archive_key(conf, environ)
        _prune(directory)
        found = _newest_complete(directory, key)
        if found is not None:
            os.utime(found)  # in use: kept by `_prune`
            log.info("the driver JVM maps its classes from %s", found)
            return f"-XX:SharedArchiveFile={found} {_QUIET}"
        if _being_written(directory, key):
            return ""
        # named after this process: its JVM is a child, and writes at its exit
        target = directory / f"{key}.{os.getpid()}.{time.time_ns()}.jsa"
        log.info("the driver JVM saves its classes for the next runs at its exit (%s)", target)
        return f"-XX:ArchiveClassesAtExit={target} {_QUIET}"
    except OSError as exc:  # an unwritable cache costs the speed-up, not the run
        log.info("no JVM class archive: %s", exc)
        return ""


def mapped(options: str) -> Path | None:
    """The archive ``options`` (from `java_options`) has the JVM map, None when none."""
    for option in options.split():
        if option.startswith("-XX:SharedArchiveFile="):
            return Path(option.partition("=")[2])
    return None


def _complete(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == DYNAMIC_MAGIC
    except OSError:
        return False


def _newest_complete(directory: Path, key: str) -> Path | None:
    """The newest complete archive of ``key``; older complete ones are removed."""
    done = sorted(
        (p for p in directory.glob(f"{key}.*.jsa") if _complete(p)),
        key=lambda p: p.stat().st_mtime,
    )
    for older in done[:-1]:
        older.unlink(missing_ok=True)
    return done[-1] if done else None


def _being_written(directory: Path, key: str) -> bool:
    """Whether a JVM may still be writing an archive of ``key``: its process lives, or its file
    is younger than `_WRITING_SECONDS` (a JVM writes its archive after its process ended)."""
    now = time.time()
    for path in directory.glob(f"{key}.*.jsa"):
        pid = path.name.split(".")[1]
        if pid.isdigit() and _alive(int(pid)):
            return True
        try:
            if now - path.stat().st_mtime < _WRITING_SECONDS:
                return True
        except OSError:
            continue
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prune(directory: Path) -> None:
    """Remove archives unused for 30 days, and leftovers of JVMs killed while writing one."""
    now = time.time()
    for path in directory.glob("*.jsa"):
        try:
            age = now - path.stat().st_mtime
            if age > _UNUSED_SECONDS or (age > 3600 and not _complete(path)):
                path.unlink()
        except OSError:
            continue
