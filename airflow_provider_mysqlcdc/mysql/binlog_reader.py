"""Read the row changes of a binlog range ``[start, end)``, transaction by transaction.

One reader serves both the snapshot's binlog window (a bounded, non-blocking range between two
watermarks) and the streaming source (blocking, or bounded micro-batches), so both paths see the
same positions and the same values (docs/architecture.md, "Data flow" and "Binlog offsets").

This module is the reader's connection side: the arguments, the replication stream it opens (its
``server_id``, heartbeats, the events it asks for) and the server errors it explains. What it does
with the events, the binlog event state machine, is ``mysql/binlog_events.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbBinLogCheckPointEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    NotImplementedEvent,
    PreviousGtidsEvent,
    QueryEvent,
    RotateEvent,
    StopEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, PartialUpdateRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_provider_mysqlcdc.core.change import RowChange, RowsEventChanges
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.mysql.binlog_events import BinlogEventStateMachine, BinlogReaderInterrupted
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.server import BinlogReadError, BinlogUnavailableError, ensure_offset_available
from airflow_provider_mysqlcdc.mysql.table_maps import RowConverter

# What the reader asks python-mysql-replication to hand over. Row events of unwanted tables are
# dropped inside the library before their rows are decoded (only_tables/only_schemas); TABLE_MAP
# events are always parsed by the library and need not be listed. The per-file events (format
# description, GTID list, checkpoint, previous-GTIDs, stop) are few and let the reader see the
# position advance between transactions, so a bounded read ends as soon as it has consumed ``end``
# rather than waiting for the next transaction. NotImplementedEvent is needed to see MySQL's
# anonymous GTID event (a transaction start) and compressed events (an error).
_ONLY_EVENTS = [
    WriteRowsEvent,
    UpdateRowsEvent,
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    XidEvent,
    XAPrepareEvent,
    QueryEvent,
    MariadbGtidEvent,
    GtidEvent,
    RotateEvent,
    FormatDescriptionEvent,
    MariadbGtidListEvent,
    MariadbBinLogCheckPointEvent,
    PreviousGtidsEvent,
    StopEvent,
    HeartbeatLogEvent,
    NotImplementedEvent,
]


#: The host name every reader reports to the source in SHOW SLAVE HOSTS.
REPORT_HOST = "mysqlcdc"
#: The ``server_id`` of a one-shot read: bounded and non-blocking, registered as no replica, like
#: ``mysqlbinlog --read-from-remote-server``. MySQL and MariaDB kick an older reader with the same
#: non-zero id off (a reconnecting replica replaces its zombie), never for id 0, so any number of
#: one-shot reads run beside the pipeline's replicas without an id of their own
#: (docs/architecture.md, "Replication server_ids").
ONE_SHOT_SERVER_ID = 0


class BinlogRangeReader(BinlogEventStateMachine):
    """Iterate the row changes of ``tables`` in ``[start, end)``; track a resumable position.

    ``start`` and ``end`` must be transaction boundaries (``SHOW MASTER STATUS`` values or a
    previous reader's :attr:`position`). ``end=None`` reads to the current end of the binlog
    (non-blocking) or forever (blocking). ``tables`` are ``'db.table'`` names matched exactly;
    None captures every table.

    A read stops only at a transaction boundary, so :attr:`position` is always a valid resume
    offset and a resumed read neither repeats nor skips a change. ``max_events`` (row changes
    yielded), ``max_transactions`` (transactions read, whether or not they touched ``tables``),
    ``timeout`` (seconds of wall time) and :meth:`stop` (from any thread) end the read at the
    first boundary after they trigger. In blocking mode the server sends a heartbeat every
    ``heartbeat_seconds`` while idle, so a stop is noticed on a quiet server too.

    Breaking out of the loop instead leaves :attr:`position` before the transaction being read, so
    a resume repeats the rows already taken from it (at-least-once); use the limits to end exactly.
    Rows of an XA transaction are emitted at its ``XA PREPARE`` (where the binlog holds them).
    A connection lost mid-read is re-established by python-mysql-replication at the last event it
    read; the reader keeps the table map across that (see ``_events``).

    The iterable is single-use. Row images are python-mysql-replication's raw values unless
    ``convert(table, values, none_sources) -> values`` is given (``none_sources`` tells an empty SET
    from NULL; pass it to :func:`~.binlog_values.binlog_row_converter`'s converter). Tables with a
    schema in ``schemas`` are decoded straight into canonical values instead (``mysql/table_maps.py``).
    Use as a context manager or call :meth:`close` (from the consuming thread).
    """

    def __init__(
        self,
        settings: ConnectionSettings,
        start: BinlogOffset,
        end: BinlogOffset | None,
        tables: Iterable[str] | None,
        server_id: int,
        *,
        blocking: bool = False,
        max_transactions: int | None = None,
        max_events: int | None = None,
        convert: RowConverter | None = None,
        timeout: float | None = None,
        heartbeat_seconds: float = 1.0,
        freeze_schema: bool = True,
        ddl: bool = False,
        schemas: Mapping[str, TableSchema] | None = None,
        added_columns: Mapping[str, Iterable[str]] | None = None,
        added_defaults: Mapping[str, Mapping[str, Any]] | None = None,
        renamed_columns: Mapping[str, Mapping[str, str]] | None = None,
        new_tables: Callable[[str], bool] | None = None,
        key_columns: Mapping[str, Sequence[str]] | None = None,
        emit_from: BinlogOffset | None = None,
        emit_to: BinlogOffset | None = None,
    ) -> None:
        if int(server_id) == ONE_SHOT_SERVER_ID and (blocking or end is None):
            raise ValueError("a one-shot read (server_id 0) must be bounded (end) and non-blocking")
        if not (0 <= int(server_id) < 2**32):
            raise ValueError(f"server_id must be in 1..2^32-1 (or 0 for a one-shot read), got {server_id}")
        if heartbeat_seconds <= 0:
            raise ValueError(f"heartbeat_seconds must be > 0, got {heartbeat_seconds}")
        super().__init__(
            start, end, tables, max_transactions=max_transactions, max_events=max_events, convert=convert,
            timeout=timeout, ddl=ddl, schemas=schemas, added_columns=added_columns, added_defaults=added_defaults,
            key_columns=key_columns, renamed_columns=renamed_columns, new_tables=new_tables, emit_from=emit_from,
            emit_to=emit_to,
        )  # fmt: skip
        self.settings = settings
        self.server_id = int(server_id)
        self.blocking = blocking
        self.heartbeat_seconds = heartbeat_seconds
        # Table ids map to one table definition for a server's lifetime (a new definition gets a new
        # id), so a TABLE_MAP seen once need not be parsed again; the map is dropped at every
        # rotation because a restart (which always starts a new file) reuses ids.
        self.freeze_schema = freeze_schema
        self._stream: BinLogStreamReader | None = None
        self._started = False

    def close(self) -> None:
        """Close the replication connections (idempotent)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def __enter__(self) -> BinlogRangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[RowChange]:
        """The range's changes one row at a time."""
        return _one_by_one(self.events())

    def events(self) -> Iterator[RowChange | RowsEventChanges]:
        """The range's changes one rows event at a time (a DDL statement: a ``RowChange`` with op 's');
        for a consumer that handles a whole event at once."""
        if self._started:
            raise RuntimeError("a BinlogRangeReader can be iterated once; create a new one from .position")
        self._started = True
        return self._read()

    # ------------------------------------------------------------------ internals
    def _open(self) -> BinLogStreamReader:
        conn = self.settings.connect()
        try:
            ensure_offset_available(conn, self.start)
        finally:
            conn.close()
        conn_kw = self.settings.replication_settings()
        # A dead peer must not hang a blocking read forever; heartbeats keep a healthy idle link busy.
        conn_kw.setdefault("read_timeout", max(30, int(4 * self.heartbeat_seconds) + 1))
        only_tables = only_schemas = None
        if self.tables is not None:
            only_schemas = sorted({d for d, _ in self.tables})
            only_tables = sorted({t for _, t in self.tables})
        return BinLogStreamReader(
            connection_settings=conn_kw,
            server_id=self.server_id,
            # Registered as a replica named "mysqlcdc": SHOW SLAVE HOSTS (SHOW REPLICAS) lists every
            # running reader with its server_id (docs/architecture.md, "Replication server_ids").
            report_slave=REPORT_HOST if self.server_id != ONE_SHOT_SERVER_ID else None,
            # is_mariadb=True without auto_position ignores log_file/log_pos (docs/architecture.md,
            # "Pitfalls"); the file/pos dump works on MariaDB with is_mariadb=False.
            is_mariadb=False,
            resume_stream=True,
            log_file=self.start.file,
            log_pos=self.start.pos,
            blocking=self.blocking,
            only_events=_ONLY_EVENTS,
            filter_non_implemented_events=False,
            only_tables=only_tables,
            only_schemas=only_schemas,
            freeze_schema=self.freeze_schema,
            slave_heartbeat=self.heartbeat_seconds,
            enable_logging=False,
        )

    def _read(self) -> Iterator[RowChange | RowsEventChanges]:
        end_key = self.end.sort_key() if self.end is not None else None
        if end_key is not None and self._pos_key >= end_key:
            self._range_done()
            return
        deadline = time.monotonic() + self.timeout if self.timeout is not None else None
        if self._should_stop(deadline):
            return
        try:
            self._stream = stream = self._open()
            yield from self._events(stream, end_key, deadline)
        except pymysql.err.OperationalError as exc:
            explained = self._explain(exc)
            if explained is None:
                raise
            raise explained from exc
        finally:
            self.close()

    def _explain(self, exc: pymysql.err.OperationalError) -> Exception | None:
        """An error that names the fix for the server errors a user can fix; None for the rest."""
        code = exc.args[0] if exc.args else None
        text = str(exc.args[-1]) if exc.args else str(exc)
        if code == 1236:
            return BinlogUnavailableError(
                f"the source cannot stream the binlog from {self.position}: {text}. If the file was purged, the "
                "changes after that point are lost to CDC: re-snapshot the affected tables (trigger the DAG with "
                "resnapshot_tables, or startup_mode=initial) and raise the server's binlog retention "
                "(binlog_expire_logs_seconds / expire_logs_days); if the position is not a transaction boundary, "
                "resume from a SHOW MASTER STATUS value or a reader's position"
            )
        if code in (1227, 1045):
            return PermissionError(
                f"the CDC user may not read the binlog ({text}): GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* "
                "TO <cdc user> (MariaDB >= 10.5: REPLICATION SLAVE, BINLOG MONITOR)"
            )
        return None


def _one_by_one(items: Iterator[RowChange | RowsEventChanges]) -> Iterator[RowChange]:
    for item in items:
        if isinstance(item, RowsEventChanges):
            yield from item.changes()
        else:
            yield item


__all__ = ["ONE_SHOT_SERVER_ID", "BinlogRangeReader", "BinlogReadError", "BinlogReaderInterrupted", "RowConverter"]
