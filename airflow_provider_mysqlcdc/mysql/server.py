"""Server-level facts: flavor/version, binlog settings, current and snapshot offsets, binlog files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pymysql

from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number


class BinlogUnavailableError(RuntimeError):
    """The server has no usable binlog (off, or the requested position was purged)."""


class BinlogReadError(RuntimeError):
    """The binlog cannot be turned into correct row changes; the message names the server setting to fix."""


@dataclass(frozen=True)
class ServerInfo:
    version: str
    is_mariadb: bool
    major: int
    minor: int

    @property
    def uses_binary_log_status(self) -> bool:
        """MySQL >= 8.4 removed SHOW MASTER STATUS in favour of SHOW BINARY LOG STATUS."""
        return not self.is_mariadb and (self.major, self.minor) >= (8, 4)


def server_info(conn: Any) -> ServerInfo:
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
    nums = version.split("-")[0].split(".")
    return ServerInfo(version, "mariadb" in version.lower(), int(nums[0]), int(nums[1]) if len(nums) > 1 else 0)


def variables(conn: Any, names: list[str]) -> dict[str, str | None]:
    """Global variables by name; a variable the server does not have maps to None."""
    out: dict[str, str | None] = {n: None for n in names}
    with conn.cursor() as cur:
        for n in names:
            cur.execute("SHOW GLOBAL VARIABLES LIKE %s", (n,))
            row = cur.fetchone()
            if row is not None:
                out[n] = str(row[1])
    return out


def server_identity(conn: Any, info: ServerInfo | None = None) -> str:
    """Which server's binlog a file:pos names: ``server_uuid`` on MySQL; on MariaDB, which has no
    uuid, its ``server_id`` (unique in a replication topology, or replication would not work)."""
    info = info or server_info(conn)
    with conn.cursor() as cur:
        if info.is_mariadb:
            cur.execute("SELECT @@GLOBAL.server_id")
            return f"mariadb:{cur.fetchone()[0]}"
        cur.execute("SELECT @@GLOBAL.server_uuid")
        return f"mysql:{str(cur.fetchone()[0]).lower()}"


def _status(cur: Any, info: ServerInfo) -> tuple[Any, list[str]]:
    stmt = "SHOW BINARY LOG STATUS" if info.uses_binary_log_status else "SHOW MASTER STATUS"
    try:
        cur.execute(stmt)
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] in (1227, 1045):
            raise PermissionError(
                "the CDC user may not read the binlog position: GRANT REPLICATION CLIENT ON *.* TO <user> "
                "(MariaDB >= 10.5: BINLOG MONITOR)"
            ) from exc
        raise
    except pymysql.err.ProgrammingError:
        cur.execute("SHOW BINARY LOG STATUS")
    row = cur.fetchone()
    if not row:
        raise BinlogUnavailableError(
            "binary logging is off on the source: start the server with log_bin enabled (--log-bin) and "
            "binlog_format=ROW"
        )
    return row, [d[0].lower() for d in cur.description]


def current_offset(conn: Any, info: ServerInfo | None = None) -> BinlogOffset:
    """The server's current binlog end: a transaction boundary, usable as a start or HW offset,
    with the GTID set executed at exactly that point and the server's identity.

    MySQL reports file, position and GTID set in one status row. MariaDB's status has no GTID
    set, so it is read before and after the status: equal, no transaction committed in between.
    """
    info = info or server_info(conn)
    identity = server_identity(conn, info)
    with conn.cursor() as cur:
        if not info.is_mariadb:
            row, desc = _status(cur, info)
            gtid = row[desc.index("executed_gtid_set")] if "executed_gtid_set" in desc else None
            return BinlogOffset(str(row[0]), int(row[1]), gtid or None, identity)
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        before = cur.fetchone()[0]
        for _ in range(50):
            row, _desc = _status(cur, info)
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
            after = cur.fetchone()[0]
            if after == before:
                break
            before = after
        else:  # a writer too busy to ever see still: ask the server what the position holds
            return gtid_offset(conn, BinlogOffset(str(row[0]), int(row[1])), info, identity)
    return BinlogOffset(str(row[0]), int(row[1]), before or None, identity)


def gtid_offset(conn: Any, offset: BinlogOffset, info: ServerInfo | None = None, identity: str | None = None
                ) -> BinlogOffset:  # fmt: skip
    """``offset`` with this server's identity and, on MariaDB, the GTID set at it
    (``BINLOG_GTID_POS``: the server reads its own binlog up to the position)."""
    info = info or server_info(conn)
    identity = identity or server_identity(conn, info)
    gtid = offset.gtid_set
    if info.is_mariadb and gtid is None:
        with conn.cursor() as cur:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (offset.file, offset.pos))
            row = cur.fetchone()
            gtid = row[0] if row and row[0] is not None else None
    return offset.on(identity, gtid)


def begin_consistent_snapshot(conn: Any, info: ServerInfo | None = None) -> BinlogOffset:
    """Open a consistent-snapshot transaction on ``conn`` and return the binlog offset it matches.

    On MariaDB the offset is exact (``Binlog_snapshot_file/position``): every transaction before it
    is visible to the snapshot and none after it. Elsewhere it is ``SHOW MASTER STATUS`` taken just
    *before* the snapshot opens — earlier than or equal to the snapshot's view, which is the safe
    side (a change replayed twice is idempotent, a change never replayed is lost).
    """
    info = info or server_info(conn)
    with conn.cursor() as cur:
        if info.is_mariadb:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
            st = {str(k).lower(): v for k, v in cur.fetchall()}
            f, p = st.get("binlog_snapshot_file"), st.get("binlog_snapshot_position")
            if not f:
                raise BinlogUnavailableError("binary logging is off on the source: enable log_bin")
            # no GTID set: BINLOG_GTID_POS reads the file up to here; whoever keeps the offset asks (gtid_offset)
            return BinlogOffset(str(f), int(p))
    before = current_offset(conn, info)
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
    return before


def binlog_files(conn: Any) -> list[tuple[str, int]]:
    """``SHOW BINARY LOGS``: the files the server still has, oldest first, with their sizes."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [(str(r[0]), int(r[1])) for r in cur.fetchall()]


def ensure_offset_available(conn: Any, offset: BinlogOffset) -> None:
    """Raise :class:`BinlogUnavailableError` naming the fix if ``offset``'s file was purged."""
    files = binlog_files(conn)
    numbers = {binlog_file_number(f) for f, _ in files}
    if offset.file_number not in numbers:
        oldest = files[0][0] if files else "none"
        raise BinlogUnavailableError(
            f"binlog file {offset.file} (needed from offset {offset}) has been purged from the source "
            f"(oldest kept: {oldest}). Changes after that point are lost to CDC: re-snapshot the affected "
            "tables (trigger the DAG with recover_purged=true for a stream that cannot resume, or with "
            "resnapshot_tables), and raise the server's binlog retention (binlog_expire_logs_seconds / "
            "expire_logs_days)"
        )
