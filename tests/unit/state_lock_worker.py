"""A separate process that takes a pipeline lock when told to: the other side of
the lock tests in test_state.py.

Usage: ``python -m tests.unit.state_lock_worker URL HOLDER PIPELINE[,PIPELINE...]``

Protocol on stdin/stdout, one line each: the worker opens the store and prints
``ready``; then, per pipeline, it waits for a line on stdin (``go``), tries the
lock and prints ``acquired`` or ``locked <message>``; then it waits for one
more line (``exit``) before it exits, so that a lock it won stays held by a
live process until the test has looked. Exit code 0 when it won every lock,
3 when it was refused at least once.
"""

from __future__ import annotations

import sys

from orchestrator.errors import RunLocked
from orchestrator.state.store import StateStore


def main(argv: list[str]) -> int:
    url, holder, pipelines = argv
    refused = False
    with StateStore(url) as store:
        print("ready", flush=True)
        for pipeline in pipelines.split(","):
            sys.stdin.readline()
            try:
                store.acquire_lock(pipeline, holder)
            except RunLocked as exc:
                refused = True
                print(f"locked {exc}", flush=True)
            else:
                print("acquired", flush=True)
        sys.stdin.readline()
    return 3 if refused else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
