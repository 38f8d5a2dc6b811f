"""A real Spark standalone cluster for tests: one master and two 1-core workers on 127.0.0.1.

Started from the installed pyspark (``SPARK_HOME`` = the pyspark package directory, which ships
``bin/spark-class`` and the jars), each daemon a foreground child process
(``SPARK_NO_DAEMONIZE=1``) in its own process group, logging to a file in the cluster's
temporary directory; every port is a free one (master RPC, master UI, each worker's UI, the
worker RPC ports are chosen by the JVM), so clusters and other tests never collide.

The cluster is ready when the master's ``/json/`` lists both workers ALIVE. Applications go to
``master_url`` (``spark-submit --master spark://127.0.0.1:P``); ``submit_env()`` is the
environment a driver needs (same ``SPARK_HOME``, ``SPARK_LOCAL_IP``, ``PYSPARK_PYTHON`` = this
interpreter, so executors run Python tasks with the venv and its editable provider), and
``submit_conf()`` the ``--conf`` pairs that turn on the event log into ``event_log_dir``.

Pitfalls this module takes care of:

* ``SPARK_LOCAL_IP=127.0.0.1`` for every JVM: otherwise the master advertises the host name's
  address and the workers/drivers may bind another interface than the one the URL names.
* the event-log directory must exist before the application starts (Spark does not create it).
* executor JVMs are children of a worker JVM (``CoarseGrainedExecutorBackend``);
  ``executor_pids()`` finds them through ``/proc`` so a test can kill one mid-job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.mariadb import free_port

log = logging.getLogger(__name__)

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The installed pyspark package directory: it is a complete SPARK_HOME (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _read_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_descendant(pid: int, ancestors: set[int]) -> bool:
    seen: set[int] = set()
    cur: int | None = pid
    while cur and cur not in seen:
        seen.add(cur)
        cur = _parent_pid(cur)
        if cur in ancestors:
            return True
    return False


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ui_port: int

    def log_tail(self, n: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


@dataclass
class SparkCluster:
    """Start/stop a standalone master and ``workers`` workers (``cores`` cores, ``memory`` each)."""

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    basedir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mysqlcdc-spark-cluster-")))
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    startup_seconds: float | None = None
    _master: _Daemon | None = None
    _workers: list[_Daemon] = field(default_factory=list)

    # ---------------------------------------------------------------- addresses
    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def master_ui_url(self) -> str:
        return f"http://127.0.0.1:{self.master_ui_port}"

    @property
    def event_log_dir(self) -> Path:
        return self.basedir / "event-logs"

    @property
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    @property
    def master_pid(self) -> int | None:
        return self._master.proc.pid if self._master else None

    def worker_dir(self, index: int) -> Path:
        return self.basedir / f"worker-{index}"

    def env(self) -> dict[str, str]:
        """Environment for the daemons and for drivers (spark-submit) of this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_NO_DAEMONIZE="1",
            SPARK_CONF_DIR=str(self.basedir / "conf"),  # empty: no stray spark-defaults/log4j config
            SPARK_LOG_DIR=str(self.basedir / "logs"),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            # daemons only: a fixed REST port (6066) would collide between clusters; C1 JIT and the
            # serial GC start a JVM faster on a small, busy machine
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        )
        return env

    submit_env = env

    def submit_conf(self) -> dict[str, str]:
        """``--conf`` settings a test application should use: event log on, into ``event_log_dir``."""
        fast_jvm = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        return {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": self.event_log_dir.as_uri(),
            # Spark 4 compresses event logs (zstd) by default: a secret scan of them would see
            # nothing. Rolling stays on (the Spark 4 default): see event_log_files().
            "spark.eventLog.compress": "false",
            "spark.pyspark.python": sys.executable,
            # executor JVMs start ~2x faster with C1 only on a busy 2-core machine
            "spark.executor.extraJavaOptions": fast_jvm,
            "spark.driver.extraJavaOptions": fast_jvm,
        }

    def event_log_files(self, app_id: str) -> list[Path]:
        """The event-log files of an application: Spark 4 rolls them into ``eventlog_v2_<app id>/events_<n>_<app id>``
        (``spark.eventLog.rolling.enabled`` is on by default); an unrolled log is the file ``<app id>``."""
        return sorted(p for p in self.event_log_dir.rglob("*") if p.is_file() and app_id in p.name)

    def spark_submit_cmd(
        self, script: str | os.PathLike[str], *args: str, conf: dict[str, str] | None = None
    ) -> list[str]:
        """``spark-submit --master <this cluster>`` with ``submit_conf()`` (plus ``conf``) for ``script``."""
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url]
        for key, value in {**self.submit_conf(), **(conf or {})}.items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, str(script), *args]

    # ---------------------------------------------------------------- lifecycle
    def _spawn(self, name: str, main_class: str, args: list[str], ui_port: int) -> _Daemon:
        log_path = self.basedir / "logs" / f"{name}.log"
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main_class, *args],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.basedir,
                start_new_session=True,
            )
        return _Daemon(name, proc, log_path, ui_port)

    def start(self, timeout: float = 90.0) -> SparkCluster:
        t0 = time.monotonic()
        for d in ("conf", "logs", "event-logs"):
            (self.basedir / d).mkdir(parents=True, exist_ok=True)
        try:
            self._master = self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)],
                self.master_ui_port,
            )
            # A worker that registers before the master is elected leader is dropped and retries
            # only ~10 s later: wait for the master to be ALIVE first (measured: 8 s vs 18 s).
            self._wait_master_alive(t0 + timeout)
            for i in range(self.workers):
                wdir = self.worker_dir(i)
                wdir.mkdir(parents=True, exist_ok=True)
                ui = free_port()
                self._workers.append(
                    self._spawn(
                        f"worker-{i}",
                        "org.apache.spark.deploy.worker.Worker",
                        ["--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
                         "--work-dir", str(wdir), "--webui-port", str(ui), self.master_url],
                        ui,
                    )
                )
            self._wait_workers_alive(t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        log.info("Spark cluster up at %s in %.1f s (%s)", self.master_url, self.startup_seconds, self.basedir)
        return self

    def master_json(self, timeout: float = 5.0) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.master_ui_url}/json/", timeout=timeout) as resp:
            return json.loads(resp.read())

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.master_json().get("workers", []) if w.get("state") == "ALIVE"]

    def _check_running(self) -> None:
        for d in [self._master, *self._workers]:
            if d is not None and d.proc.poll() is not None:
                raise RuntimeError(f"Spark {d.name} exited with {d.proc.returncode}:\n{self.log_tails()}")

    def _wait_master_alive(self, deadline: float) -> None:
        last: object = None
        while time.monotonic() < deadline:
            self._check_running()
            try:
                status = self.master_json(timeout=2).get("status")
                if status == "ALIVE":
                    return
                last = f"master status {status}"
            except OSError as exc:  # the master's UI is not up yet
                last = exc
            time.sleep(0.1)
        raise RuntimeError(f"Spark master not ALIVE at {self.master_ui_url}/json/: {last}\n{self.log_tails()}")

    def _wait_workers_alive(self, deadline: float) -> None:
        last: object = None
        while time.monotonic() < deadline:
            self._check_running()
            try:
                alive = self.alive_workers()
                if len(alive) >= self.workers:
                    return
                last = f"{len(alive)} ALIVE worker(s)"
            except OSError as exc:  # the master's UI is not up yet
                last = exc
            time.sleep(0.1)
        raise RuntimeError(
            f"Spark cluster not ready ({self.workers} ALIVE workers expected at {self.master_ui_url}/json/): "
            f"{last}\n{self.log_tails()}"
        )

    def log_tails(self, n: int = 1500) -> str:
        return "\n".join(
            f"--- {d.name} ({d.log_path}) ---\n{d.log_tail(n)}" for d in [self._master, *self._workers] if d
        )

    def active_app_ids(self) -> list[str]:
        """Ids of the applications the master lists as running."""
        return [str(a["id"]) for a in self.master_json().get("activeapps", [])]

    def executor_pids(self, app_id: str | None = None) -> list[int]:
        """Pids of the executor JVMs (``CoarseGrainedExecutorBackend``) that are children of this cluster's
        workers; ``app_id`` keeps those of one application (its argv carries ``--app-id <id>``)."""
        workers = set(self.worker_pids)
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            argv = _read_cmdline(pid)
            if argv and EXECUTOR_MAIN in argv and (app_id is None or app_id in argv) and _is_descendant(pid, workers):
                out.append(pid)
        return sorted(out)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the workers (and with them their executors), then the master: SIGTERM, then SIGKILL each group."""
        daemons = [*self._workers, *([self._master] if self._master else [])]
        executors = self.executor_pids() if self._workers else []
        for d in daemons:
            if d.proc.poll() is None:
                d.proc.terminate()
        deadline = time.monotonic() + timeout
        for d in daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for d in daemons:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(d.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.proc.wait(timeout=5)
        for pid in executors:  # executors live in their worker's group, but be sure
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._workers = []
        self._master = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.basedir, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
