"""A fake ``spark-submit`` for the unit tests: what the hooks would run, run without Spark.

It prints its arguments and whether it received the source connection, and, for a stream job
(``--run-id``), reports the run as running in the state store, as the real driver does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPT = """#!{python}
import json, os, socket, sys, time
args = sys.argv[1:]
print("ARGS " + json.dumps(args), flush=True)
print("SOURCE " + os.environ.get("MYSQLCDC_SOURCE", ""), flush=True)
print("SID " + str(os.getsid(0)), flush=True)
if os.environ.get("FAKE_SPARK_RECORD"):  # the test reads the command line back
    with open(os.environ["FAKE_SPARK_RECORD"], "a") as f:
        f.write(json.dumps(args) + "\\n")
if "--run-id" in args:
    from airflow_provider_mysqlcdc.state import StateStore
    opt = lambda name: args[args.index(name) + 1]
    store = StateStore(opt("--state-root"), opt("--pipeline-id"))
    store.write_json("stream/run.json", {{"run_id": opt("--run-id"), "state": "running", "pid": os.getpid(),
                                          "host": socket.gethostname(), "heartbeat_at": time.time()}})
sys.exit(int(os.environ.get("FAKE_SPARK_EXIT", "0")))
"""

SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[2]"})
SOURCE = json.dumps(
    {"conn_type": "mysql_cdc", "host": "db.example", "port": 3307, "login": "cdc", "password": "s3cret-pw",
     "schema": "shop", "extra": {"ssl": "required"}}
)


def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the fake first on ``PATH``; returns its directory."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "spark-submit"
    script.write_text(SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    return bin_dir


def connections(monkeypatch: pytest.MonkeyPatch, spark: str = SPARK_LOCAL, source: str = SOURCE) -> None:
    """The two connections, as environment variables (how users and the tests define them)."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark)
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_CDC_DEFAULT", source)


def printed(log: str, key: str) -> str:
    """The value the fake printed after ``key`` in its output."""
    for line in log.splitlines():
        if line.startswith(key + " "):
            return line[len(key) + 1 :]
    raise AssertionError(f"{key} not in the fake's output:\n{log}")
