"""A primary and a GTID replica of one flavour, for failover tests (issue 34).

A user's CDC may read a replica, or be moved to one when the primary dies. To test that, this
module starts two private servers of the same flavour, replicating with GTIDs: the replica logs
what it applies (``log_slave_updates``/``log_replica_updates``), so its binlog holds the primary's
transactions with their original GTIDs, but at its own file names and positions. Both binlogs have
the same base name (``mysql-bin``) on purpose: a primary's ``file:pos`` looks valid on the replica
and points at something else, which is what a failover test must catch. ``replica_rotations``
moves the replica some files ahead, so the two servers' coordinates never coincide by chance.

Flavours: ``mariadb1011`` (the machine's own, :class:`MariaDBServer`), ``mariadb118`` and
``mysql97`` (Debian roots, :class:`RootServer`). MariaDB runs with ``gtid_strict_mode`` and
connects with ``MASTER_USE_GTID=slave_pos``; MySQL with ``gtid_mode=ON`` and
``SOURCE_AUTO_POSITION=1``.

Each server creates its own users at start (the CDC user and ``repl``, the replication user),
then both binlogs and GTID states are reset before replication starts: every GTID either server
holds afterwards came through the pair, and no user-creating transaction exists on one side only
(under strict mode a replica's own GTID would stop replication).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymysql

from tests.support.mariadb import MariaDBServer, ServerSettings
from tests.support.servers import FLAVOURS, RootServer

REPL_USER = "repl"
REPL_PASSWORD = "repl-pass"
PAIR_FLAVOURS = ("mariadb1011", "mariadb118", "mysql97")

_MARIADB_GTID = re.compile(r"GTID (\d+-\d+-\d+)")
_MYSQL_GTID = re.compile(r"GTID_NEXT\s*=\s*'([^']+)'")


def _new_server(flavour: str, settings: ServerSettings) -> MariaDBServer:
    if flavour == "mariadb1011":
        return MariaDBServer(settings=settings)
    if flavour in FLAVOURS:
        return RootServer(FLAVOURS[flavour], settings=settings)
    raise ValueError(f"unknown flavour {flavour!r}: one of {', '.join(PAIR_FLAVOURS)}")


def is_mariadb(server: MariaDBServer) -> bool:
    flavour = getattr(server, "flavour", None)
    return flavour is None or bool(flavour.is_mariadb)


def parse_mariadb_gtid_pos(pos: str) -> dict[int, tuple[int, int]]:
    """``"0-1-5,1-2-3"`` -> ``{domain: (server_id, seq_no)}`` (one GTID per domain in a position)."""
    out: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in pos.split(","))):
        domain, server_id, seq = (int(x) for x in part.split("-"))
        out[domain] = (server_id, seq)
    return out


def gtid_state(server: MariaDBServer) -> str:
    """What the server has binlogged or executed: MariaDB ``@@gtid_binlog_pos``, MySQL ``@@gtid_executed``
    (newlines MySQL puts between UUIDs removed)."""
    var = "@@GLOBAL.gtid_binlog_pos" if is_mariadb(server) else "@@GLOBAL.gtid_executed"
    return str(server.query(f"SELECT {var}")[0][0] or "").replace("\n", "")


def binlog_gtids(server: MariaDBServer) -> list[str]:
    """Every GTID in the server's binlog files, in binlog order (``SHOW BINLOG EVENTS`` per file)."""
    pattern = _MARIADB_GTID if is_mariadb(server) else _MYSQL_GTID
    out: list[str] = []
    for row in server.query("SHOW BINARY LOGS"):
        for event in server.query(f"SHOW BINLOG EVENTS IN '{row[0]}'"):
            if str(event[2]).startswith("Gtid") and not str(event[2]).startswith("Gtid_list"):
                match = pattern.search(str(event[5]))
                if match:
                    out.append(match.group(1))
    return out


def current_coordinates(server: MariaDBServer) -> tuple[str, int]:
    """The server's binlog end as ``(file, pos)`` (``SHOW BINARY LOG STATUS`` from MySQL 8.4 on)."""
    row = server.query("SHOW MASTER STATUS" if is_mariadb(server) else "SHOW BINARY LOG STATUS")[0]
    return str(row[0]), int(row[1])


class ReplicaPair:
    """A primary (server_id 1) and its GTID replica (server_id 2) of one flavour.

    ``primary`` and ``replica`` keep their original roles after a failover; :meth:`promote_replica`
    returns the replica, now writable, as the new primary. The replica runs ``read_only``, which
    stops the CDC user but not root (SUPER / READ_ONLY ADMIN): a test can still break it on purpose.
    """

    def __init__(self, flavour: str, replica_rotations: int = 2):
        self.flavour = flavour
        self.replica_rotations = replica_rotations
        self.primary = _new_server(flavour, self._settings(1))
        self.replica = _new_server(flavour, self._settings(2))
        self.is_mariadb = is_mariadb(self.primary)
        self.promoted = False

    def _settings(self, server_id: int) -> ServerSettings:
        if self.flavour == "mysql97":  # gtid_mode and enforce_gtid_consistency: the flavour's own args
            extra = ["--log-replica-updates=ON", "--skip-replica-start"]
        else:
            extra = ["--gtid-strict-mode=ON", "--log-slave-updates", "--skip-slave-start"]
        return ServerSettings(server_id=server_id, extra_args=extra)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> ReplicaPair:
        """Start both servers at once, reset their binlogs, rotate the replica's, start replication."""
        servers = (self.primary, self.replica)
        try:
            for server in servers:
                self._prepare_datadir(server)
            with ThreadPoolExecutor(max_workers=2) as pool:
                list(pool.map(lambda s: s.start(), servers))
            for server in servers:
                self._reset(server)
            if self.replica_rotations:
                self.replica.flush_binary_logs(self.replica_rotations)
            self.replica.execute("SET GLOBAL read_only = ON")
            self._start_replication()
        except BaseException:
            self.destroy()
            raise
        return self

    def _prepare_datadir(self, server: MariaDBServer) -> None:
        # Copy the template here, in one thread (the class-level template caches are not thread-safe).
        # MySQL's template holds auto.cnf: every copy would share one server_uuid, and a replica
        # refuses a source with its own UUID. Without the file each server makes a new one.
        if server.datadir.exists():
            return
        template = server._template_for() if isinstance(server, RootServer) else MariaDBServer._template()
        shutil.copytree(template, server.datadir)
        (server.datadir / "auto.cnf").unlink(missing_ok=True)

    def _reset(self, server: MariaDBServer) -> None:
        """The replication user, then empty binlog and GTID state (see the module docstring for why)."""
        server.execute(
            f"CREATE USER IF NOT EXISTS '{REPL_USER}'@'%' IDENTIFIED BY '{REPL_PASSWORD}'",
            f"GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'%'",
        )
        if self.is_mariadb:
            server.execute("RESET MASTER", "SET GLOBAL gtid_slave_pos = ''")
        else:
            server.execute("RESET BINARY LOGS AND GTIDS")  # RESET MASTER is gone since 8.4

    def _start_replication(self) -> None:
        port = self.primary.port
        if self.is_mariadb:
            self.replica.execute(
                f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={port}, MASTER_USER='{REPL_USER}', "
                f"MASTER_PASSWORD='{REPL_PASSWORD}', MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos",
                "START SLAVE",
            )
        else:
            # caching_sha2_password over plain TCP: the replica must fetch the source's RSA key.
            self.replica.execute(
                f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', SOURCE_PORT={port}, "
                f"SOURCE_USER='{REPL_USER}', SOURCE_PASSWORD='{REPL_PASSWORD}', SOURCE_CONNECT_RETRY=1, "
                "SOURCE_AUTO_POSITION=1, GET_SOURCE_PUBLIC_KEY=1",
                "START REPLICA",
            )
        self.wait_connected()

    def destroy(self) -> None:
        """SIGKILL both, then remove them: their data is thrown away, and a clean stop of a MySQL
        primary with a replica attached takes ~9 s (see :meth:`stop_primary`)."""
        for server in (self.replica, self.primary):
            if server.proc is not None and server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait(timeout=30)
            server.destroy()

    def __enter__(self) -> ReplicaPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ---------------------------------------------------------------- replication state
    def replica_status(self) -> dict[str, Any]:
        """SHOW SLAVE STATUS (MariaDB) / SHOW REPLICA STATUS (MySQL) as a dict, empty when not a replica."""
        stmt = "SHOW SLAVE STATUS" if self.is_mariadb else "SHOW REPLICA STATUS"
        with self.replica.root_connection(cursorclass=pymysql.cursors.DictCursor) as conn, conn.cursor() as cur:
            cur.execute(stmt)
            row = cur.fetchone()
        return dict(row) if row else {}

    def _status_summary(self, status: dict[str, Any] | None = None) -> str:
        status = self.replica_status() if status is None else status
        keys = ("IO_Running", "SQL_Running", "Last_IO_Errno", "Last_IO_Error", "Last_SQL_Errno", "Last_SQL_Error")
        picked = {k: v for k, v in status.items() if any(k.endswith(key) for key in keys)}
        workers = ""
        if not self.is_mariadb and status.get("Last_SQL_Errno"):
            # MySQL's applier is multi-threaded: Last_SQL_Error only says a worker failed; the worker says why.
            errors = self.replica.query(
                "SELECT LAST_ERROR_NUMBER, LAST_ERROR_MESSAGE"
                " FROM performance_schema.replication_applier_status_by_worker WHERE LAST_ERROR_NUMBER <> 0"
            )
            workers = f"; worker errors: {[f'{n}: {m}' for n, m in errors]}"
        return f"{picked}{workers}; replica error log: {self.replica.error_log_tail(1500)}"

    def wait_connected(self, timeout: float = 30.0) -> None:
        """Until the replica's IO thread is connected to the primary and its SQL thread runs."""
        io, sql = ("Slave_IO_Running", "Slave_SQL_Running") if self.is_mariadb else (
            "Replica_IO_Running", "Replica_SQL_Running")
        deadline = time.monotonic() + timeout
        while True:
            status = self.replica_status()
            if status.get(io) == "Yes" and status.get(sql) == "Yes":
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica not connected after {timeout:.0f} s: {self._status_summary(status)}")
            time.sleep(0.02)

    def caught_up(self) -> bool:
        """Has the replica applied every transaction the primary has committed?"""
        if self.is_mariadb:
            wanted = parse_mariadb_gtid_pos(gtid_state(self.primary))
            have = parse_mariadb_gtid_pos(str(self.replica.query("SELECT @@GLOBAL.gtid_slave_pos")[0][0] or ""))
            return all(d in have and have[d][1] >= seq for d, (_, seq) in wanted.items())
        wanted_set = gtid_state(self.primary)
        return bool(self.replica.query("SELECT GTID_SUBSET(%s, @@GLOBAL.gtid_executed)", (wanted_set,))[0][0])

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Until :meth:`caught_up`; fails at once when the replica's SQL thread stopped on an error."""
        deadline = time.monotonic() + timeout
        while not self.caught_up():
            status = self.replica_status()
            if status.get("Last_SQL_Errno"):
                raise AssertionError(f"replication stopped: {self._status_summary(status)}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"replica not caught up after {timeout:.0f} s: primary at {gtid_state(self.primary)!r}, "
                    f"replica at {gtid_state(self.replica)!r}; {self._status_summary(status)}"
                )
            time.sleep(0.02)

    # ---------------------------------------------------------------- failover
    def kill_primary(self) -> None:
        """SIGKILL the primary's server process: no clean shutdown, no final events in its binlog.
        (``chroot`` execs the server, so its process is the server's.)"""
        proc = self.primary.proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError("the primary is not running")
        proc.kill()
        proc.wait(timeout=30)

    def stop_primary(self) -> None:
        """Shut the primary down cleanly (SIGTERM, as ``MariaDBServer.stop``).

        MySQL 9.7 takes ~9 s here while the replica is attached: shutdown gives its binlog dump
        thread time to end, and that thread ignores KILL while waiting for updates, even with the
        replica's IO thread stopped. MariaDB stops at once.
        """
        self.primary.stop()

    def promote_replica(self, drain: bool = True, timeout: float = 30.0) -> MariaDBServer:
        """Make the replica a writable primary and return it.

        With ``drain`` it first stops receiving and applies what it already received (its relay
        log), as a careful failover does; then it forgets its source (``RESET SLAVE ALL`` /
        ``RESET REPLICA ALL``) and turns ``read_only`` off. It keeps its binlog and GTID state: on
        MariaDB new transactions get GTIDs ``0-2-N`` continuing the sequence (strict mode holds),
        on MySQL the replica's own ``server_uuid``.
        """
        if self.is_mariadb:
            self.replica.execute("STOP SLAVE IO_THREAD")
            if drain:
                self._wait_relay_applied(timeout)
            self.replica.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF")
        else:
            self.replica.execute("STOP REPLICA IO_THREAD")
            if drain:
                self._wait_relay_applied(timeout)
            self.replica.execute(
                "STOP REPLICA", "RESET REPLICA ALL", "SET GLOBAL super_read_only = OFF", "SET GLOBAL read_only = OFF"
            )
        self.promoted = True
        return self.replica

    def _wait_relay_applied(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.replica_status()
            if self.is_mariadb:
                received = parse_mariadb_gtid_pos(str(status.get("Gtid_IO_Pos") or ""))
                have = parse_mariadb_gtid_pos(str(self.replica.query("SELECT @@GLOBAL.gtid_slave_pos")[0][0] or ""))
                done = all(d in have and have[d][1] >= seq for d, (_, seq) in received.items())
            else:
                received_set = str(status.get("Retrieved_Gtid_Set") or "").replace("\n", "")
                done = bool(self.replica.query("SELECT GTID_SUBSET(%s, @@GLOBAL.gtid_executed)", (received_set,))[0][0])
            if done:
                return
            if status.get("Last_SQL_Errno"):
                raise AssertionError(f"replica cannot apply its relay log: {self._status_summary(status)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"relay log not applied after {timeout:.0f} s: {self._status_summary(status)}")
            time.sleep(0.02)

    # ---------------------------------------------------------------- coordinates
    def rotate_replica_binlog(self, count: int = 1) -> None:
        """Move the replica's binlog ``count`` files further ahead of the primary's."""
        self.replica.flush_binary_logs(count)


@contextlib.contextmanager
def replica_pair(flavour: str, replica_rotations: int = 2) -> Iterator[ReplicaPair]:
    """A started :class:`ReplicaPair`, destroyed afterwards (for module-scoped fixtures)."""
    pair = ReplicaPair(flavour, replica_rotations=replica_rotations)
    pair.start()
    try:
        yield pair
    finally:
        pair.destroy()
