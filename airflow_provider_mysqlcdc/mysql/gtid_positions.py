"""GTID sets and binlog positions of one server: the set at a position, the position of a set.

Both are read from ``SHOW BINLOG EVENTS`` (event headers and a short info text, no row is
decoded): every binlog file opens with the set of every transaction in the files before it (MySQL
``Previous_gtids``, MariaDB ``Gtid_list``), and every transaction opens with a GTID event.

- :func:`gtid_set_at` — the set behind a position, from a known earlier position's set plus the
  GTID events in between: what a stream offset carries so a failover can find it again.
- :func:`position_of` — the first transaction boundary on *this* server behind which exactly a
  given set lies: where a stream that applied that set resumes after a failover. It refuses,
  naming the fix, when this server lacks some of those transactions or purged what comes after.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from airflow_provider_mysqlcdc.core.gtid import Gtid, GtidSet, GtidSetError
from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number
from airflow_provider_mysqlcdc.mysql.server import (
    BinlogUnavailableError,
    ServerInfo,
    binlog_files,
    current_offset,
    server_info,
)

log = logging.getLogger(__name__)

_PAGE = 5000  # events per SHOW BINLOG EVENTS round trip
_MYSQL_GTID = re.compile(r"GTID_NEXT\s*=\s*'([^']+)'", re.IGNORECASE)
_MARIADB_GTID = re.compile(r"GTID\s+(\d+-\d+-\d+)")
_START_SET_TYPES = ("Previous_gtids", "Gtid_list")


class GtidPositionError(RuntimeError):
    """A GTID set cannot be placed on this server; the message names the fix."""


def _events(conn: Any, file: str, start: int) -> Iterator[tuple[int, str, int, str]]:
    """``(pos, type, end, info)`` of every event of ``file`` from event start ``start``."""
    cur_pos = start
    while True:
        with conn.cursor() as cur:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT %s", (file, int(cur_pos), _PAGE))
            rows = [(int(r[1]), str(r[2]), int(r[4]), str(r[5] or "")) for r in cur.fetchall()]
        yield from rows
        if len(rows) < _PAGE:
            return
        cur_pos = rows[-1][2]


def event_gtid(type_: str, info: str) -> Gtid | None:
    """The GTID a ``SHOW BINLOG EVENTS`` row opens a transaction with, if it is a GTID event."""
    if type_ != "Gtid":
        return None
    m = _MYSQL_GTID.search(info) or _MARIADB_GTID.search(info)
    return Gtid.parse(m.group(1)) if m else None


def file_start_set(conn: Any, file: str, info: ServerInfo) -> GtidSet:
    """The set of every transaction in the files before ``file`` (its first events say)."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINLOG EVENTS IN %s LIMIT 4", (file,))
        for r in cur.fetchall():
            if str(r[2]) in _START_SET_TYPES:
                return GtidSet.parse(str(r[5] or ""), info.is_mariadb)
    return GtidSet.parse("", info.is_mariadb)


def gtid_set_at(conn: Any, known: BinlogOffset, end: BinlogOffset, info: ServerInfo | None = None) -> str | None:
    """The GTID set at transaction boundary ``end``: ``known``'s set plus every transaction that
    starts in ``[known, end)``. None if ``known`` carries no set (offsets from before GTIDs were
    recorded, or MySQL with gtid_mode OFF)."""
    if not known.gtid_set:
        return None
    info = info or server_info(conn)
    gtids = GtidSet.parse(known.gtid_set, info.is_mariadb)
    for f, _size in binlog_files(conn):
        n = binlog_file_number(f)
        if n < known.file_number or n > end.file_number:
            continue
        for pos, type_, _end, text in _events(conn, f, known.pos if n == known.file_number else 4):
            if n == end.file_number and pos >= end.pos:
                break
            g = event_gtid(type_, text)
            if g is not None:
                gtids = gtids.added(g)
    return str(gtids)


def position_of(conn: Any, target: GtidSet, identity: str, info: ServerInfo | None = None) -> BinlogOffset:
    """The first transaction boundary on this server behind which exactly ``target`` lies."""
    return positions_of(conn, [target], identity, info)[0]


def positions_of(
    conn: Any, targets: list[GtidSet], identity: str, info: ServerInfo | None = None
) -> list[BinlogOffset]:
    """For each set, the first transaction boundary on this server behind which exactly it lies.

    The newest binlog file whose start set a target contains holds its position: from that file's
    start, every transaction the target contains is skipped, and the first one it does not contain
    is where reading resumes. One forward read serves every target. Replicas keep the source's
    commit order (``replica_preserve_commit_order`` / MariaDB's in-order parallel replication), so
    nothing a target lacks lies before its position.
    """
    info = info or server_info(conn)
    head = current_offset(conn, info)
    executed = GtidSet.parse(head.gtid_set, info.is_mariadb)
    for target in targets:
        if not executed.issuperset(target):
            raise GtidPositionError(
                f"this server ({identity}) has not executed every transaction the stream already applied: it "
                f"has {executed or 'no GTIDs'}, the stream's offset needs {target}. Point the connection at the "
                "server that replicated from the old primary (GTID mode on, log_slave_updates / "
                "log_replica_updates on), wait for it to catch up, or re-snapshot (trigger the DAG with "
                "recover_purged=true)"
            )
    files = [f for f, _ in binlog_files(conn)]
    starts = [file_start_set(conn, f, info) for f in files]
    first: int | None = None
    for target in targets:
        index = next((i for i in range(len(files) - 1, -1, -1) if target.issuperset(starts[i])), None)
        if index is None:
            raise BinlogUnavailableError(
                f"the transactions after GTID set {target} are no longer in this server's binlog (oldest kept: "
                f"{files[0] if files else 'none'}, which starts after some of them): they are lost to CDC. "
                "Trigger the DAG with recover_purged=true to re-snapshot, and raise the binlog retention"
            )
        first = index if first is None else min(first, index)
    found: dict[int, BinlogOffset] = {}
    for f in files[first or 0:]:
        for pos, type_, _end, text in _events(conn, f, 4):
            g = event_gtid(type_, text)
            if g is None:
                continue
            for i, target in enumerate(targets):
                if i not in found and not _contains(target, g):
                    found[i] = BinlogOffset(f, pos, str(target), identity)
            if len(found) == len(targets):
                return [found[i] for i in range(len(targets))]
    return [found.get(i) or head.on(identity, str(t)) for i, t in enumerate(targets)]


def _contains(target: GtidSet, g: Gtid) -> bool:
    try:
        return target.contains(g)
    except GtidSetError as exc:
        raise GtidPositionError(f"{exc}: the stream's offset was written on a server of another kind") from None
