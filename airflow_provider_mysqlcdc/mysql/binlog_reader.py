"""Read the row changes of a binlog range ``[start, end)``, transaction by transaction.

One reader serves both the snapshot's binlog window (a bounded, non-blocking range between two
watermarks) and the streaming source (blocking, or bounded micro-batches), so both paths see the
same positions and the same values (DESIGN §3).

Positions, as verified against ``SHOW BINLOG EVENTS`` on MariaDB 10.11 (tests/integration/
test_binlog_reader.py):

* every event header carries ``log_pos`` = the position *after* the event and ``event_size`` =
  its full length (header, body and checksum), so an event starts at ``log_pos - event_size``;
* a transaction starts at the start of its GTID event (MariaDB always writes one; MySQL writes a
  GTID or an anonymous-GTID event, and very old servers a ``BEGIN`` query) and ends at the end of
  its ``Xid`` event, its ``COMMIT``/``ROLLBACK`` query, its ``XA PREPARE`` event, or — for a
  standalone statement such as DDL — its single query;
* the server opens every dump with a *fake* rotate event (timestamp 0, ``log_pos`` 0) naming the
  start file and, when starting mid-file, a format description event with ``log_pos`` 0; neither
  is in the file at that place, so neither moves a position;
* ``Annotate_rows`` events are in the file but are not sent (they leave a gap, which is why a
  start is computed from the event itself and never from the previous event's end).

The range test is done here on ``(file number, pos)`` of each transaction's start: a transaction
that starts before ``end`` is read whole, one that starts at or after ``end`` is not read at all.
python-mysql-replication's own ``end_log_pos`` compares the position only and ignores the file, so
a rotation inside the range would stop it early (DESIGN §3).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import BINLOG
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

from airflow_provider_mysqlcdc.core.change import RowChange
from airflow_provider_mysqlcdc.core.ddl import table_ddl
from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.rows_decoder import RowsDecoder, UnsupportedRowFormat
from airflow_provider_mysqlcdc.mysql.server import BinlogUnavailableError, ensure_offset_available

log = logging.getLogger(__name__)

RowConverter = Callable[[str, dict[str, Any], Any], dict[str, Any]]

# MariaDB GTID event flag: the group is one statement with no BEGIN/COMMIT around it (DDL, XA COMMIT).
_FL_STANDALONE = 0x01

# Event types python-mysql-replication cannot decode but which carry row changes: reading past
# them would silently lose data, so they stop the reader with the fix.
_COMPRESSED_EVENTS = {
    40: "MySQL binlog_transaction_compression=ON (TRANSACTION_PAYLOAD events)",
    0xA5: "MariaDB log_bin_compress=ON (compressed query events)",
    0xA6: "MariaDB log_bin_compress=ON (compressed rows events)",
    0xA7: "MariaDB log_bin_compress=ON (compressed rows events)",
    0xA8: "MariaDB log_bin_compress=ON (compressed rows events)",
    0xA9: "MariaDB log_bin_compress=ON (compressed rows events)",
    0xAA: "MariaDB log_bin_compress=ON (compressed rows events)",
    0xAB: "MariaDB log_bin_compress=ON (compressed rows events)",
}

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

# Transaction states.
_NONE = 0  # between transactions: every event end is a valid resume offset
_GROUP = 1  # BEGIN ... COMMIT: ends at Xid, COMMIT/ROLLBACK query or XA PREPARE
_SINGLE = 2  # standalone statement: ends with its query
_UNKNOWN = 3  # MySQL GTID seen: a BEGIN query makes it a group, any other query is standalone


class BinlogReadError(RuntimeError):
    """The binlog cannot be turned into correct row changes; the message names the server setting to fix."""


class BinlogReaderInterrupted(RuntimeError):
    """The replication connection broke inside a transaction; resume from :attr:`BinlogRangeReader.position`."""


def _split_table(name: str) -> tuple[str, str]:
    db, sep, table = name.partition(".")
    if not sep or not db or not table:
        raise ValueError(f"tables must be given as 'db.table', got {name!r}")
    return db, table


def _full_bitmap(ncols: int) -> bytes:
    return ((1 << ncols) - 1).to_bytes((ncols + 7) // 8, "little")


def _library_images(rows: list[dict[str, Any]], op: str, name: str, convert: RowConverter | None) -> list[Any]:
    """python-mysql-replication's rows in the shape ``RowsDecoder.decode`` gives: (before, after)
    pairs for 'u', one image per row for 'c' and 'd'; converted when ``convert`` is given."""
    if op == "u":
        if convert is None:
            return [(r["before_values"], r["after_values"]) for r in rows]
        return [
            (convert(name, r["before_values"], r.get("before_none_sources")),
             convert(name, r["after_values"], r.get("after_none_sources")))
            for r in rows
        ]  # fmt: skip
    if convert is None:
        return [r["values"] for r in rows]
    return [convert(name, r["values"], r.get("none_sources")) for r in rows]


class BinlogRangeReader:
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
    from NULL; pass it to :func:`cdc.types.binlog_row_converter`'s converter).
    Use as a context manager or call :meth:`close`
    (from the consuming thread).
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
        key_columns: Mapping[str, Sequence[str]] | None = None,
        emit_from: BinlogOffset | None = None,
        emit_to: BinlogOffset | None = None,
    ) -> None:
        if not (1 <= int(server_id) < 2**32):
            raise ValueError(f"server_id must be in 1..2^32-1, got {server_id}")
        if heartbeat_seconds <= 0:
            raise ValueError(f"heartbeat_seconds must be > 0, got {heartbeat_seconds}")
        self.settings = settings
        self.start = start
        self.end = end
        self.server_id = int(server_id)
        self.blocking = blocking
        self.max_transactions = max_transactions
        self.max_events = max_events
        self.convert = convert
        self.timeout = timeout
        self.heartbeat_seconds = heartbeat_seconds
        # Table ids map to one table definition for a server's lifetime (a new definition gets a new
        # id), so a TABLE_MAP seen once need not be parsed again; the map is dropped at every
        # rotation because a restart (which always starts a new file) reuses ids.
        self.freeze_schema = freeze_schema
        # Yield a RowChange with op "s" (after = {"kind", "sql"}) for each DDL statement that alters,
        # empties, drops, renames or replaces one of ``tables``: no row event ever shows those.
        self.ddl = ddl
        # Tables with a schema here are decoded by source/rows_decoder.py straight into canonical
        # values (several times faster than python-mysql-replication + ``convert``); a table map it
        # cannot decode exactly falls back to the library. ``key_columns``: before images hold only
        # these columns (the stream needs the keys only).
        self.schemas = dict(schemas or {})
        self.added_columns = {t: tuple(c) for t, c in (added_columns or {}).items()}
        self.key_columns = dict(key_columns or {})
        # A slice of a large transaction (stream/boundaries.py): only rows events (and DDL) that
        # start in [emit_from, emit_to) are decoded and yielded; the read ends at the first rows
        # event at or after emit_to (stop_reason "slice_end", reached_end True).
        self.emit_from = emit_from
        self.emit_to = emit_to
        self.tables: frozenset[tuple[str, str]] | None = (
            None if tables is None else frozenset(_split_table(t) for t in tables)
        )
        self._stream: BinLogStreamReader | None = None
        self._stop = threading.Event()
        self._started = False
        self._reached_end = False
        # Last boundary consumed, as (file, pos); a BinlogOffset is built only when asked for.
        self._pos_file = start.file
        self._pos = start.pos
        self._pos_key = start.sort_key()
        self.events_yielded = 0  # row changes yielded
        self.transactions_read = 0  # transactions read whole, whether or not they touched ``tables``
        # Why the read ended: "end" (range consumed), "eof" (non-blocking read reached the binlog's
        # current end), "stop", "max_events", "max_transactions", "timeout"; None while reading.
        self.stop_reason: str | None = None

    # ------------------------------------------------------------------ public state
    @property
    def position(self) -> BinlogOffset:
        """The last transaction boundary fully consumed: resume here to get exactly the rest."""
        return BinlogOffset(self._pos_file, self._pos)

    @property
    def reached_end(self) -> bool:
        """True once everything before ``end`` (or, with ``end=None`` non-blocking, the whole binlog) was read."""
        return self._reached_end

    def stop(self) -> None:
        """Ask the read to end at the next transaction boundary (thread-safe)."""
        self._stop.set()

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
            # is_mariadb=True without auto_position ignores log_file/log_pos (DESIGN §5); the
            # file/pos dump works on MariaDB with is_mariadb=False.
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

    def _should_stop(self, deadline: float | None) -> bool:
        """Has a limit, stop() or the timeout triggered? Records why in :attr:`stop_reason`."""
        if self._stop.is_set():
            self.stop_reason = "stop"
        elif self.max_events is not None and self.events_yielded >= self.max_events:
            self.stop_reason = "max_events"
        elif self.max_transactions is not None and self.transactions_read >= self.max_transactions:
            self.stop_reason = "max_transactions"
        elif deadline is not None and time.monotonic() >= deadline:
            self.stop_reason = "timeout"
        else:
            return False
        return True

    def _boundary(self, file: str, fileno: int, pos: int) -> None:
        key = (fileno, pos)
        if key > self._pos_key:
            self._pos_file, self._pos, self._pos_key = file, pos, key

    def _read(self) -> Iterator[RowChange]:
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

    def _events(
        self, stream: BinLogStreamReader, end_key: tuple[int, int] | None, deadline: float | None
    ) -> Iterator[RowChange]:
        wanted = self.tables
        convert = self.convert
        emit_from = None if self.emit_from is None else self.emit_from.sort_key()
        emit_to = None if self.emit_to is None else self.emit_to.sort_key()
        file = self.start.file
        fileno = binlog_file_number(file)
        state = _NONE
        tx_offset: BinlogOffset | None = None
        # table id -> 'db.table' for wanted tables, None for unwanted; rebuilt after each rotation.
        names: dict[int, str | None] = {}
        full_bitmaps: dict[int, bytes] = {}
        decoders: dict[int, RowsDecoder | None] = {}  # per table id, like ``names``

        for ev in stream:
            cls = ev.__class__
            pkt = ev.packet

            # ---- rows: the hot path ------------------------------------------------------------
            if cls is UpdateRowsEvent or cls is WriteRowsEvent or cls is DeleteRowsEvent:
                start = pkt.log_pos - pkt.event_size
                if state == _NONE:  # no GTID/BEGIN seen: cannot happen on a sane server, stay safe
                    log.warning("rows event at %s:%d outside a transaction; treating it as one", file, start)
                    tx_offset = BinlogOffset(file, start)
                    state = _GROUP
                if emit_from is not None or emit_to is not None:
                    at = (fileno, start)
                    if emit_to is not None and at >= emit_to:
                        self._slice_done()
                        return
                    if emit_from is not None and at < emit_from:
                        continue  # another task's share of this transaction: not decoded
                tid = ev.table_id
                try:
                    name = names[tid]
                except KeyError:
                    name = names[tid] = self._table_name(ev, wanted)
                if name is None:
                    continue
                ncols = ev.number_of_columns
                full = full_bitmaps.get(ncols)
                if full is None:
                    full = full_bitmaps[ncols] = _full_bitmap(ncols)
                if ev.columns_present_bitmap != full or (cls is UpdateRowsEvent and ev.columns_present_bitmap2 != full):
                    raise BinlogReadError(
                        f"a rows event of {name} at {file}:{start} does not carry every column: the source "
                        "logs partial row images. Set binlog_row_image=FULL (SET GLOBAL binlog_row_image='FULL' "
                        "and in the server config), then re-snapshot the tables changed since"
                    )
                ts = pkt.timestamp
                evpos = (fileno, start)
                assert tx_offset is not None
                try:
                    dec = decoders[tid]
                except KeyError:
                    dec = decoders[tid] = self._decoder(ev, name)
                op = "u" if cls is UpdateRowsEvent else ("c" if cls is WriteRowsEvent else "d")
                if dec is not None:
                    images = dec.decode(pkt.read(ev.event_size - pkt.read_bytes), op)
                else:
                    images = _library_images(ev.rows, op, name, convert)
                if op == "u":
                    for i, (b, a) in enumerate(images):
                        yield RowChange("u", name, b, a, tx_offset, evpos, i, ts)
                elif op == "c":
                    for i, a in enumerate(images):
                        yield RowChange("c", name, None, a, tx_offset, evpos, i, ts)
                else:
                    for i, b in enumerate(images):
                        yield RowChange("d", name, b, None, tx_offset, evpos, i, ts)
                self.events_yielded += len(images)
                continue

            # ---- transaction structure -----------------------------------------------------------
            log_pos = pkt.log_pos
            ends_tx = False
            if cls is XidEvent or cls is XAPrepareEvent:
                ends_tx = state != _NONE
            elif (
                cls is MariadbGtidEvent
                or cls is GtidEvent
                or (cls is NotImplementedEvent and pkt.event_type == BINLOG.ANONYMOUS_GTID_LOG_EVENT)
            ):
                start = log_pos - pkt.event_size
                if state != _NONE:
                    # The previous group had no terminator we recognise: it ended where this one starts.
                    log.warning("transaction before %s:%d had no recognised end; closing it there", file, start)
                    self._end_transaction(file, fileno, start)
                    state = _NONE
                    if self._stop_at_boundary(end_key, deadline):
                        return
                if end_key is not None and (fileno, start) >= end_key:
                    self._range_done()
                    return
                tx_offset = BinlogOffset(file, start)
                if cls is MariadbGtidEvent:
                    state = _SINGLE if ev.flags & _FL_STANDALONE else _GROUP
                else:
                    state = _UNKNOWN
                continue
            elif cls is QueryEvent:
                q = ev.query.strip().upper()
                if state == _NONE:  # a server that writes no GTID events: BEGIN or a statement opens the tx
                    start = log_pos - pkt.event_size
                    if end_key is not None and (fileno, start) >= end_key:
                        self._range_done()
                        return
                    tx_offset = BinlogOffset(file, start)
                    if q == "BEGIN":
                        state = _GROUP
                        continue
                    ends_tx = True
                elif state == _UNKNOWN:
                    if q == "BEGIN":
                        state = _GROUP
                        continue
                    ends_tx = True
                elif state == _SINGLE:
                    ends_tx = True
                else:
                    ends_tx = q in ("COMMIT", "ROLLBACK")
                if self.ddl and q not in ("BEGIN", "COMMIT", "ROLLBACK"):
                    at = (fileno, log_pos - pkt.event_size)
                    if (emit_from is None or at >= emit_from) and (emit_to is None or at < emit_to):
                        yield from self._ddl_changes(ev, file, fileno, log_pos - pkt.event_size, tx_offset)
            elif cls is RotateEvent:
                if state != _NONE:
                    # python-mysql-replication reconnects by itself after a lost connection (server
                    # killed the dump, net_write_timeout while the consumer was slow) and resumes at
                    # the end of the last event it read; the server restarts the dump with a fake
                    # rotate. Inside a transaction that is fine as long as the table map already
                    # read is kept (the TABLE_MAP events are behind us) and the file is the same.
                    if not log_pos and ev.next_binlog == file:
                        log.info("replication connection re-established inside the transaction at %s", tx_offset)
                        continue
                    raise BinlogReaderInterrupted(
                        f"the replication stream moved to {ev.next_binlog}:{ev.position} inside the transaction that "
                        f"began at {tx_offset}; resume from the last boundary {self.position}"
                    )
                file = ev.next_binlog
                fileno = binlog_file_number(file)
                # Table ids are reused after a server restart, which always starts a new file; between
                # transactions the map can always be dropped (every transaction maps its tables again).
                stream.table_map = {}
                names.clear()
                decoders.clear()
                if log_pos:  # a real rotation at the end of a file: the next file is where we are
                    self._boundary(file, fileno, ev.position)
                    if self._stop_at_boundary(end_key, deadline):
                        return
                continue
            elif cls is HeartbeatLogEvent:
                # Sent only while the server waits for new events: everything up to log_pos of the
                # named file has been sent. Lets a blocking read notice stop()/timeouts/end when idle.
                hb_file = ev.ident.rstrip("\x00")
                if state == _NONE and log_pos and hb_file:
                    self._boundary(hb_file, binlog_file_number(hb_file), log_pos)
                if state == _NONE and self._stop_at_boundary(end_key, deadline):
                    return
                continue
            elif cls is PartialUpdateRowsEvent:
                raise BinlogReadError(
                    f"the source logs partial JSON updates (event at {file}:{log_pos - pkt.event_size}), which carry "
                    "no full after image: set binlog_row_value_options='' (SET GLOBAL and in the server config)"
                )
            elif cls is NotImplementedEvent:
                etype = pkt.event_type
                if etype in _COMPRESSED_EVENTS:
                    raise BinlogReadError(
                        f"the source writes compressed binlog events ({_COMPRESSED_EVENTS[etype]}, event at "
                        f"{file}:{log_pos - pkt.event_size}) which python-mysql-replication cannot decode: turn "
                        "binlog compression off on the source and re-snapshot the tables changed since"
                    )
                if etype == BINLOG.INCIDENT_EVENT:
                    raise BinlogReadError(
                        f"the source logged an INCIDENT event at {file}:{log_pos - pkt.event_size}: changes around "
                        "it may be missing from the binlog, so CDC cannot be exact past it. Re-snapshot the captured "
                        "tables (trigger the DAG with resnapshot_tables) from an offset after it"
                    )
                # Other events this library does not know (e.g. heartbeat v2) may not carry a
                # file position in their header: never a boundary.
                continue
            else:
                # Format description, GTID list, checkpoint, previous-GTIDs, stop: only a boundary
                # when between transactions, and never when synthesised (log_pos 0).
                if state == _NONE and log_pos:
                    self._boundary(file, fileno, log_pos)
                    if self._stop_at_boundary(end_key, deadline):
                        return
                continue

            if ends_tx:
                self._end_transaction(file, fileno, log_pos)
                state = _NONE
                if self._stop_at_boundary(end_key, deadline):
                    return

        # The server sent EOF (non-blocking): it sends whole transaction groups only.
        if state != _NONE:
            log.warning(
                "binlog ended inside the transaction that began at %s; position stays at %s", tx_offset, self.position
            )
        self.stop_reason = "eof"
        if state == _NONE and end_key is None:
            self._reached_end = True

    def _ddl_changes(
        self, ev: Any, file: str, fileno: int, start: int, tx_offset: BinlogOffset | None
    ) -> Iterator[RowChange]:
        schema = ev.schema.decode() if isinstance(ev.schema, bytes | bytearray) else (ev.schema or None)
        captured = None if self.tables is None else frozenset(f"{d}.{t}" for d, t in self.tables)
        for d in table_ddl(ev.query, schema, captured):
            log.info("DDL on %s at %s:%d: %s", d.table, file, start, ev.query[:200])
            yield RowChange(
                "s", d.table, None, {"kind": d.kind, "sql": ev.query}, tx_offset or BinlogOffset(file, start),
                (fileno, start), 0, int(ev.packet.timestamp),
            )

    def _end_transaction(self, file: str, fileno: int, pos: int) -> None:
        self.transactions_read += 1
        self._boundary(file, fileno, pos)

    def _stop_at_boundary(self, end_key: tuple[int, int] | None, deadline: float | None) -> bool:
        """At a boundary: has the range been consumed, or was the read asked to stop?"""
        if end_key is not None and self._pos_key >= end_key:
            self._range_done()
            return True
        return self._should_stop(deadline)

    def _slice_done(self) -> None:
        """The slice's last rows event is behind: the rest of the transaction is another task's."""
        self._reached_end = True
        self.stop_reason = "slice_end"

    def _range_done(self) -> None:
        """Everything before ``end`` is consumed: ``end`` itself is the resume offset (a boundary by contract)."""
        assert self.end is not None
        self._reached_end = True
        self.stop_reason = "end"
        self._boundary(self.end.file, self.end.file_number, self.end.pos)

    def _decoder(self, ev: Any, name: str) -> RowsDecoder | None:
        """The fast decoder of this table map, or None (no schema given, or a format it refuses)."""
        schema = self.schemas.get(name)
        if schema is None:
            return None
        try:
            return RowsDecoder(name, ev.columns, schema, self.added_columns.get(name, ()), self.key_columns.get(name))
        except UnsupportedRowFormat as exc:
            log.info("%s: decoding with python-mysql-replication (%s)", name, exc)
            return None

    def _table_name(self, ev: Any, wanted: frozenset[tuple[str, str]] | None) -> str | None:
        """'db.table' of a rows event's table if it is wanted (checking its column names), else None."""
        schema, table = ev.schema, ev.table
        if wanted is not None and (schema, table) not in wanted:
            return None
        name = f"{schema}.{table}"
        missing = [i for i, c in enumerate(ev.columns) if not c.name]
        if missing:
            raise BinlogReadError(
                f"binlog rows events of {name} carry no column names (columns {missing} unnamed): the source "
                "must log full row metadata. Set binlog_row_metadata=FULL (SET GLOBAL binlog_row_metadata='FULL' "
                "and in the server config; MySQL >= 8.0.14 / MariaDB >= 10.5); events written before the change "
                "stay unnamed, so start CDC (or re-snapshot) from an offset after it"
            )
        return name
