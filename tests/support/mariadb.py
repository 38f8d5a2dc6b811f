"""A private MariaDB server with a ROW binlog, for tests, the demo and benchmarks.

The machine may already run a MariaDB on 3306 without a binlog; we never touch it. Each
``MariaDBServer`` owns a temporary datadir, a free port on 127.0.0.1 and a socket, and is
configured the way CDC needs it (``--log-bin --binlog-format=ROW --binlog-row-image=FULL
--binlog-row-metadata=FULL``). Negative tests restart it with other settings.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings

log = logging.getLogger(__name__)

CDC_USER = "cdc"
CDC_PASSWORD = "cdc-pass"
CDC_GRANTS = "SELECT, REPLICATION SLAVE, REPLICATION CLIENT"


def _find_binary(name: str) -> str:
    for candidate in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        f"{name} not found: install MariaDB server binaries (apt-get install mariadb-server), "
        "or run `make bootstrap`"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerSettings:
    """The binlog-relevant settings of the private server (the negative tests vary these)."""

    log_bin: bool = True
    binlog_format: str = "ROW"
    binlog_row_image: str = "FULL"
    binlog_row_metadata: str = "FULL"
    server_id: int = 1
    extra_args: list[str] = field(default_factory=list)

    def args(self) -> list[str]:
        out = [f"--server-id={self.server_id}"]
        if self.log_bin:
            out += [
                "--log-bin=mysql-bin",
                f"--binlog-format={self.binlog_format}",
                f"--binlog-row-image={self.binlog_row_image}",
                f"--binlog-row-metadata={self.binlog_row_metadata}",
            ]
        else:
            out += ["--skip-log-bin"]
        return out + list(self.extra_args)


class MariaDBServer:
    """Start/stop/restart a private MariaDB; connection helpers for root and the CDC user."""

    _template_dir: Path | None = None  # one initialized datadir per process, copied per server

    def __init__(self, basedir: str | os.PathLike[str] | None = None, settings: ServerSettings | None = None):
        self._own_basedir = basedir is None
        self.basedir = Path(basedir or tempfile.mkdtemp(prefix="mysqlcdc-mariadb-"))
        self.datadir = self.basedir / "data"
        self.socket = str(self.basedir / "mysqld.sock")
        self.port = free_port()
        self.settings = settings or ServerSettings()
        self.proc: subprocess.Popen[bytes] | None = None

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def _template(cls) -> Path:
        if cls._template_dir is None or not (cls._template_dir / "mysql").exists():
            tdir = Path(tempfile.mkdtemp(prefix="mysqlcdc-template-")) / "data"
            cmd = [
                _find_binary("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={tdir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root" if os.geteuid() == 0 else f"--user={getpass.getuser()}",
            ]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"mariadb-install-db failed: {res.stderr[-2000:]}")
            cls._template_dir = tdir
        return cls._template_dir

    def start(self) -> MariaDBServer:
        if not self.datadir.exists():
            shutil.copytree(self._template(), self.datadir)
        cmd = [
            _find_binary("mariadbd"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--socket={self.socket}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.basedir / 'mysqld.pid'}",
            f"--log-error={self.basedir / 'error.log'}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=256M",
            "--innodb-flush-log-at-trx-commit=2",
            "--sync-binlog=0",
            "--max-connections=500",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            *self.settings.args(),
        ]
        if os.geteuid() == 0:
            cmd.append("--user=root")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()
        self._prepare_users()
        log.info("private MariaDB up on 127.0.0.1:%s (datadir %s)", self.port, self.datadir)
        return self

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited with {self.proc.returncode}: {self.error_log_tail()}")
            try:
                self.root_connection().close()
                return
            except pymysql.err.OperationalError as exc:
                last = exc
                time.sleep(0.1)
        raise RuntimeError(f"mariadbd not ready after {timeout}s: {last}; {self.error_log_tail()}")

    def error_log_tail(self, n: int = 3000) -> str:
        p = self.basedir / "error.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def _prepare_users(self) -> None:
        with self.root_connection() as conn, conn.cursor() as cur:
            # Anonymous users shadow new users' TCP logins.
            cur.execute("DELETE FROM mysql.global_priv WHERE User=''")
            cur.execute("FLUSH PRIVILEGES")
            cur.execute(f"CREATE USER IF NOT EXISTS '{CDC_USER}'@'%' IDENTIFIED BY '{CDC_PASSWORD}'")
            cur.execute(f"GRANT {CDC_GRANTS} ON *.* TO '{CDC_USER}'@'%'")

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, settings: ServerSettings | None = None) -> None:
        """Restart on the same datadir and port (binlog and data survive), optionally re-configured."""
        self.stop()
        if settings is not None:
            self.settings = settings
        self.start()

    def destroy(self) -> None:
        self.stop()
        if self._own_basedir:
            shutil.rmtree(self.basedir, ignore_errors=True)

    def __enter__(self) -> MariaDBServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ---------------------------------------------------------------- connections
    def root_connection(self, database: str | None = None, **kw: Any) -> pymysql.connections.Connection:
        return pymysql.connect(
            unix_socket=self.socket, user="root", password="", database=database,
            autocommit=True, charset="utf8mb4", **kw
        )

    def connection_params(self, user: str = CDC_USER, password: str = CDC_PASSWORD) -> dict[str, Any]:
        """Parameters of the CDC user's TCP login (what an Airflow connection would hold)."""
        return {"host": "127.0.0.1", "port": self.port, "user": user, "password": password}

    def cdc_settings(self, user: str = CDC_USER, password: str = CDC_PASSWORD) -> ConnectionSettings:
        """The CDC user's TCP login as ConnectionSettings (TLS off: a local test server)."""
        return ConnectionSettings(host="127.0.0.1", port=self.port, user=user, password=password, ssl=False)

    def airflow_conn_json(self, user: str = CDC_USER, password: str = CDC_PASSWORD) -> str:
        import json

        return json.dumps(
            {
                "conn_type": "mysql_cdc",
                "host": "127.0.0.1",
                "port": self.port,
                "login": user,
                "password": password,
                "extra": {"ssl": False},
            }
        )

    def execute(self, *statements: str, database: str | None = None) -> None:
        with self.root_connection(database) as conn, conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt)

    def query(self, sql: str, args: Any = None, database: str | None = None) -> list[tuple[Any, ...]]:
        with self.root_connection(database) as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def purge_binary_logs_to(self, file: str, timeout: float = 60.0) -> None:
        """PURGE BINARY LOGS TO ``file``, retried until done: MariaDB silently keeps a file that crash
        recovery may still need until the binlog background thread has written the next checkpoint
        event, so a PURGE right after FLUSH can be a no-op."""
        deadline = time.monotonic() + timeout
        while True:
            self.execute(f"PURGE BINARY LOGS TO '{file}'")
            files = [r[0] for r in self.query("SHOW BINARY LOGS")]
            if files[0] == file:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"binlogs before {file} still there after {timeout:.0f} s: {files}")
            time.sleep(0.05)

    def flush_binary_logs(self, count: int = 1, timeout: float = 30.0) -> None:
        """FLUSH BINARY LOGS ``count`` times and wait until the server has settled the new file.

        Why wait: after a rotation MariaDB writes a ``Binlog_checkpoint`` event naming the new
        file into it asynchronously (measured 0.5-0.9 s later here), once the engine has made the
        previous file's transactions durable. A test that takes SHOW MASTER STATUS right after the
        flush and expects the next transaction to start exactly there would race that 43-byte
        event; waiting for it makes positions after a flush deterministic.
        """
        for _ in range(count):
            self.execute("FLUSH BINARY LOGS")
        current = self.query("SHOW MASTER STATUS")[0][0]
        deadline = time.monotonic() + timeout
        while True:
            events = self.query(f"SHOW BINLOG EVENTS IN '{current}'")
            if any(e[2] == "Binlog_checkpoint" and str(e[5]).strip() == current for e in events):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Binlog_checkpoint for {current} after {timeout:.0f} s: {events}")
            time.sleep(0.02)


@contextlib.contextmanager
def running_server(settings: ServerSettings | None = None):  # type: ignore[no-untyped-def]
    server = MariaDBServer(settings=settings)
    try:
        yield server.start()
    finally:
        server.destroy()
