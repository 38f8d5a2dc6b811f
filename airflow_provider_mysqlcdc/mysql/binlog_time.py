"""Find binlog offsets by time: the earliest one the server keeps, and the first transaction at or
after a moment (``startup_mode`` ``earliest-offset`` and ``timestamp``).

Why a search over the replication protocol: ``SHOW BINLOG EVENTS`` has no timestamps, while every
event header carries one. Each binlog file opens with a format description event stamped when the
file was created, so those stamps order the files; a binary search over them finds the one file
that can hold the first transaction at or after the moment, and one pass over that file finds the
transaction. A transaction's time is its first event's header time (the GTID event, or ``BEGIN``
where there is none): whole seconds, the server's clock. Offsets returned are transaction
boundaries, as every offset in this package (docs/architecture.md, "Binlog offsets").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError, binlog_files, current_offset

log = logging.getLogger(__name__)

REPORT_HOST = "mysqlcdc"
_EVENTS = [FormatDescriptionEvent, GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, RotateEvent]


def earliest_offset(conn: object) -> BinlogOffset:
    """The start of the oldest binlog file the server still has (a transaction boundary)."""
    files = binlog_files(conn)
    if not files:
        raise BinlogUnavailableError("the source keeps no binlog files: enable log_bin")
    return BinlogOffset(files[0][0], 4)


def offset_at_time(settings: ConnectionSettings, conn: object, when: float, server_id: int) -> BinlogOffset:
    """The offset of the first transaction whose time is at or after ``when`` (epoch seconds).

    After the last transaction: the current end of the binlog. Before the oldest file the server
    keeps: :class:`BinlogUnavailableError` naming the oldest time still available.
    """
    files = [f for f, _ in binlog_files(conn)]
    if not files:
        raise BinlogUnavailableError("the source keeps no binlog files: enable log_bin")
    created = _FileTimes(settings, server_id)
    target = int(when)  # event times are whole seconds: a transaction in that second counts
    if created(files[0]) > target:
        raise BinlogUnavailableError(
            f"the binlog at {_iso(when)} has been purged: the oldest file the source keeps, {files[0]}, starts "
            f"at {_iso(created(files[0]))}. Use a later timestamp, or startup_mode=earliest-offset, or "
            "startup_mode=initial to snapshot the tables"
        )
    # The last file created before the target second: every earlier file ended (rotated) before it
    # too, so none holds a transaction at or after it; later files may, and so may this one.
    lo, hi = 0, len(files) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if created(files[mid]) < target:
            lo = mid
        else:
            hi = mid - 1
    for name in files[lo:]:
        found = _first_transaction_at_or_after(settings, server_id, name, target)
        if found is not None:
            log.info("first transaction at or after %s: %s (searched %d file headers)", _iso(when), found,
                     created.reads)  # fmt: skip
            return found
    end = current_offset(conn)
    log.info("no transaction at or after %s yet: starting at the current end %s", _iso(when), end)
    return BinlogOffset(end.file, end.pos)


class _FileTimes:
    """Creation time of a binlog file (its format description event), read once per file."""

    def __init__(self, settings: ConnectionSettings, server_id: int):
        self.settings, self.server_id = settings, server_id
        self.cache: dict[str, int] = {}
        self.reads = 0

    def __call__(self, name: str) -> int:
        if name not in self.cache:
            self.reads += 1
            self.cache[name] = _scan(self.settings, self.server_id, name, lambda ev, start: (
                int(ev.timestamp) if isinstance(ev, FormatDescriptionEvent) and ev.packet.log_pos else None
            ))  # fmt: skip
            if self.cache[name] is None:
                raise BinlogUnavailableError(f"binlog file {name} has no format description event")
        return self.cache[name]


def _first_transaction_at_or_after(
    settings: ConnectionSettings, server_id: int, name: str, target: int
) -> BinlogOffset | None:
    """Every transaction opens with a GTID event on MariaDB and on MySQL 5.7+ (anonymous ones
    without gtid_mode); without them, with ``BEGIN``, or is a statement of its own (DDL)."""
    in_tx = False

    def check(ev: object, start: int) -> BinlogOffset | None:
        nonlocal in_tx
        opens = False
        if isinstance(ev, GtidEvent | MariadbGtidEvent):
            opens, in_tx = True, True
        elif isinstance(ev, QueryEvent):
            query = ev.query.strip().upper() if isinstance(ev.query, str) else ""
            opens = not in_tx  # after a GTID event, BEGIN or a DDL is part of that transaction
            in_tx = query == "BEGIN" or (in_tx and query != "COMMIT" and not opens)
        elif isinstance(ev, XidEvent):
            in_tx = False
        return BinlogOffset(name, start) if opens and int(ev.timestamp) >= target else None  # type: ignore[attr-defined]

    return _scan(settings, server_id, name, check, stop_at_rotate=True)  # type: ignore[return-value]


def _scan(
    settings: ConnectionSettings,
    server_id: int,
    name: str,
    check: Callable[[object, int], object],
    stop_at_rotate: bool = False,
) -> object:
    """Events of binlog file ``name`` from its start until ``check`` returns a value (returned) or
    the file (or the binlog) ends (None)."""
    stream = BinLogStreamReader(
        connection_settings=settings.replication_settings(),
        server_id=server_id,
        report_slave=REPORT_HOST,
        is_mariadb=False,  # file/pos dump (docs/architecture.md, "Pitfalls")
        resume_stream=True,
        log_file=name,
        log_pos=4,
        blocking=False,
        only_events=_EVENTS,
        enable_logging=False,
    )
    started = time.monotonic()
    try:
        for ev in stream:
            log_pos = ev.packet.log_pos
            if isinstance(ev, RotateEvent):
                if log_pos and stop_at_rotate:  # a real rotation: the file ended
                    return None
                continue
            if not log_pos:
                continue
            found = check(ev, log_pos - ev.packet.event_size)  # the whole event: header, body, checksum
            if found is not None:
                return found
    finally:
        stream.close()
        log.debug("scanned %s in %.2fs", name, time.monotonic() - started)
    return None


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


__all__ = ["earliest_offset", "offset_at_time"]
