"""A separate process that holds a pipeline lock with its heartbeat: the other side of the
lease tests in test_lease.py.

Usage: ``python -m tests.unit.state_lease_worker URL PIPELINE HOLDER LEASE_SECONDS``

It takes the lock with `orchestrator.state.lease.hold` and prints ``held``; then, per line
on stdin: ``write`` makes one fenced state write (a new run of the pipeline) and prints
``wrote`` or ``lost <message>``; ``exit`` leaves the block (the heartbeat stops) and exits 0.
"""

from __future__ import annotations

import sys

from orchestrator.errors import LockLost
from orchestrator.state.lease import hold
from orchestrator.state.store import StateStore


def main(argv: list[str]) -> int:
    url, pipeline, holder, lease_seconds = argv
    with hold(url, pipeline, holder, lease_seconds=int(lease_seconds), track_pid=True) as lease:
        print("held", flush=True)
        for line in sys.stdin:
            if line.strip() == "exit":
                break
            with StateStore(url, guard=lease) as store:
                try:
                    store.create_run(pipeline, {"by": holder})
                except LockLost as exc:
                    print(f"lost {exc}", flush=True)
                else:
                    print("wrote", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
