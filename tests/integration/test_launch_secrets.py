"""Secrets in a session's settings never reach a command line (`orchestrator.services.spark`,
``WITHHELD_AT_LAUNCH``): PySpark launches the driver JVM with every setting as a ``--conf``
argument, which ``ps`` shows to every user of the machine and a JVM crash report copies. The
object store's keys reach the session through the gateway instead, and its Hadoop
configuration has them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration]

SECRET = "tm-probe-secret-7f3a9c"
TOKEN = "tm-probe-token-51be02"

# In a process of its own: the suite's driver JVM is already running.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    from orchestrator.services.spark import SessionSettings, get_session

    secret, token = sys.argv[1], sys.argv[2]
    conf = {
        "spark.hadoop.fs.s3a.access.key": "AKIDPROBE",
        "spark.hadoop.fs.s3a.secret.key": secret,
        "spark.hadoop.fs.s3a.session.token": token,
    }
    spark = get_session(SessionSettings("probe", "local[1]", conf=conf))
    context = spark.sparkContext
    shown = []  # processes whose command line holds a secret (this one holds them as arguments)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
        except OSError:  # ended meanwhile
            continue
        if secret.encode() in line or token.encode() in line:
            shown.append(line.replace(b"\\0", b" ").decode(errors="replace")[:200])
    hadoop = context._jsc.hadoopConfiguration()
    print(json.dumps({
        "shown": shown,
        "secret": hadoop.get("fs.s3a.secret.key"),
        "token": hadoop.get("fs.s3a.session.token"),
        "name": context.getConf().get("spark.app.name"),
    }))
    """
)


def test_the_object_stores_keys_stay_off_the_jvms_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, SECRET, TOKEN],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shown"] == []
    assert result["secret"] == SECRET and result["token"] == TOKEN  # the session has them
    assert result["name"] == "probe"  # the other settings went as before
