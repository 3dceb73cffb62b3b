"""A Spark Connect server on this machine: pyspark's own ``SparkConnectServer`` (what
``sbin/start-connect-server.sh`` starts), run with ``spark-submit`` in the foreground on a free port
of 127.0.0.1 with the JDBC jar, as docs/spark.md "Spark Connect" says. For the Spark Connect test
and ``bench/bench_dag_vs_cli.py --connect``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.config import DEFAULT_JDBC_JAR

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def connect_server(work: Path, master: str = "local[2]", timeout: float = 300) -> Iterator[str]:
    """Start the server (its log in ``work/connect-server.log``); yields its ``sc://`` URL and
    stops it (the process this started, by its pid) when the block ends."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    port = _free_port()
    log = work / "connect-server.log"
    env = {
        **os.environ,
        "SPARK_HOME": home,
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
    }
    with log.open("w") as out:
        server = subprocess.Popen(
            [
                f"{home}/bin/spark-submit",
                "--class",
                SERVER_CLASS,
                "--master",
                master,
                "--jars",
                DEFAULT_JDBC_JAR,
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.driver.extraJavaOptions=-Duser.timezone=UTC",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + timeout
        while "Spark Connect server started" not in log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Spark Connect server did not start:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
