"""Private MySQL 9.7 and MariaDB 11.8 servers for tests, beside the machine's MariaDB 10.11 (issue 34).

Their Debian packages need a newer libc than the machine's, so each runs from its own Debian root
built by ``scripts/server_roots.sh`` (``make server-roots``) under ``$MYSQLCDC_SERVER_ROOTS``
(default ``/var/cache/mysqlcdc/roots``): ``chroot ROOT mysqld ...``. A chroot shares the network,
so clients reach the server on 127.0.0.1:port over TCP as they would any server; root's own
connection uses the server's socket, which lives inside the root with the datadir
(``ROOT/var/lib/mysqlcdc/<id>/``).

:class:`RootServer` has the public interface of :class:`tests.support.mariadb.MariaDBServer`
(it is one: only what differs is overridden), so a test can take any of the three servers. What
differs between flavours is data (:class:`Flavour`): binaries, how a datadir is initialised, the
extra server arguments. Charset and collation are left at each server's defaults on purpose
(``utf8mb4_0900_ai_ci`` on MySQL 9.7, ``utf8mb4_uca1400_ai_ci`` on MariaDB 11.8): those are what
a user's tables have.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql

from tests.support.mariadb import CDC_GRANTS, CDC_PASSWORD, CDC_USER, MariaDBServer, ServerSettings

ROOTS_ENV = "MYSQLCDC_SERVER_ROOTS"
DEFAULT_ROOTS = "/var/cache/mysqlcdc/roots"
ROOT_STAMP = ".mysqlcdc-root-complete"  # written by scripts/server_roots.sh once a root is complete
DATA_IN_ROOT = "/var/lib/mysqlcdc"  # where servers keep their datadirs, as seen inside the root


class ServerRootMissingError(RuntimeError):
    """The Debian root a server runs from has not been built."""


@dataclass(frozen=True)
class Flavour:
    """What differs between servers, as data."""

    name: str  # fixture name and root name, e.g. "mysql97"
    version: tuple[int, int]  # the major.minor the root holds
    is_mariadb: bool
    server_binary: str  # inside the root
    init_args: tuple[str, ...]  # initialise a datadir: argv without --datadir
    extra_args: tuple[str, ...]  # server arguments besides the common ones and ServerSettings'
    default_collation: str  # what a new utf8mb4 table gets (the server's default, never overridden)

    def roots_dir(self) -> Path:
        return Path(os.environ.get(ROOTS_ENV) or DEFAULT_ROOTS)

    def root(self) -> Path:
        root = self.roots_dir() / self.name
        if not (root / ROOT_STAMP).exists():
            raise ServerRootMissingError(
                f"the {self.name} server root {root} has not been built: run `make server-roots` "
                f"(scripts/server_roots.sh; about a minute per root; ${ROOTS_ENV} moves the roots)"
            )
        return root


MYSQL97 = Flavour(
    name="mysql97",
    version=(9, 7),
    is_mariadb=False,
    server_binary="mysqld",
    init_args=("mysqld", "--no-defaults", "--initialize-insecure", "--user=root"),
    extra_args=(
        "--gtid-mode=ON",
        "--enforce-gtid-consistency=ON",
        "--mysqlx=OFF",  # else every server would want port 33060
        "--innodb-buffer-pool-size=128M",
        "--innodb-redo-log-capacity=64M",
    ),
    default_collation="utf8mb4_0900_ai_ci",
)

MARIADB118 = Flavour(
    name="mariadb118",
    version=(11, 8),
    is_mariadb=True,
    server_binary="mariadbd",
    init_args=(
        "mariadb-install-db",
        "--no-defaults",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        "--user=root",
    ),
    extra_args=("--innodb-buffer-pool-size=128M",),  # GTID is always on in MariaDB
    default_collation="utf8mb4_uca1400_ai_ci",
)

FLAVOURS = {f.name: f for f in (MYSQL97, MARIADB118)}


def _rmtree_later(path: Path) -> None:
    atexit.register(shutil.rmtree, path, ignore_errors=True)


class RootServer(MariaDBServer):
    """A private server of ``flavour`` run from its Debian root with chroot; interface of MariaDBServer."""

    _templates: dict[str, Path] = {}  # one initialised datadir per flavour and process, copied per server

    def __init__(self, flavour: Flavour, settings: ServerSettings | None = None):
        self.flavour = flavour
        self.root = flavour.root()
        self._id = uuid.uuid4().hex[:12]
        super().__init__(basedir=self.root / DATA_IN_ROOT.lstrip("/") / self._id, settings=settings)
        self._own_basedir = True
        self.basedir.mkdir(parents=True, exist_ok=True)

    def inside(self, path: Path) -> str:
        """``path`` (on the host, under the root) as the server sees it."""
        return "/" + str(path.relative_to(self.root))

    # ---------------------------------------------------------------- lifecycle
    def _template_for(self) -> Path:
        cached = self._templates.get(self.flavour.name)
        if cached is not None and (cached / "mysql").exists():
            return cached
        tdir = self.root / DATA_IN_ROOT.lstrip("/") / f"template-{os.getpid()}-{uuid.uuid4().hex[:8]}" / "data"
        tdir.parent.mkdir(parents=True, exist_ok=True)
        _rmtree_later(tdir.parent)
        cmd = ["chroot", str(self.root), *self.flavour.init_args, f"--datadir={self.inside(tdir)}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or not (tdir / "mysql").exists():
            raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {(res.stdout + res.stderr)[-2000:]}")
        self._templates[self.flavour.name] = tdir
        return tdir

    def start(self) -> RootServer:
        if not self.datadir.exists():
            shutil.copytree(self._template_for(), self.datadir)
        self.basedir.mkdir(parents=True, exist_ok=True)
        cmd = [
            "chroot",
            str(self.root),
            self.flavour.server_binary,
            "--no-defaults",
            f"--datadir={self.inside(self.datadir)}",
            f"--socket={self.inside(Path(self.socket))}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.inside(self.basedir / 'mysqld.pid')}",
            f"--log-error={self.inside(self.basedir / 'error.log')}",
            "--skip-name-resolve",
            "--innodb-flush-log-at-trx-commit=2",
            "--sync-binlog=0",
            "--max-connections=500",
            "--secure-file-priv=",
            "--user=root",
            *self.flavour.extra_args,
            *self.settings.args(),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()
        self._prepare_users()
        return self

    def _prepare_users(self) -> None:
        with self.root_connection() as conn, conn.cursor() as cur:
            if self.flavour.is_mariadb:
                cur.execute("DELETE FROM mysql.global_priv WHERE User=''")  # anonymous users shadow TCP logins
                cur.execute("FLUSH PRIVILEGES")
            # MySQL: the server's default plugin, caching_sha2_password (what a user's server has).
            cur.execute(f"CREATE USER IF NOT EXISTS '{CDC_USER}'@'%' IDENTIFIED BY '{CDC_PASSWORD}'")
            cur.execute(f"GRANT {CDC_GRANTS} ON *.* TO '{CDC_USER}'@'%'")

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.basedir, ignore_errors=True)

    def __enter__(self) -> RootServer:
        return self.start()

    # ---------------------------------------------------------------- connections
    def root_connection(self, database: str | None = None, **kw: Any) -> pymysql.connections.Connection:
        # Over the socket (inside the root): root@localhost, no password, no RSA key exchange.
        return pymysql.connect(
            unix_socket=self.socket, user="root", password="", database=database,
            autocommit=True, charset="utf8mb4", **kw
        )

    def flush_binary_logs(self, count: int = 1, timeout: float = 30.0) -> None:
        if self.flavour.is_mariadb:
            super().flush_binary_logs(count, timeout)
            return
        # MySQL writes no Binlog_checkpoint event after a rotation: the new file is settled at once.
        for _ in range(count):
            self.execute("FLUSH BINARY LOGS")


def start_server(name: str, settings: ServerSettings | None = None) -> RootServer:
    """Start a private server of flavour ``name`` ("mysql97", "mariadb118")."""
    return RootServer(FLAVOURS[name], settings=settings).start()

