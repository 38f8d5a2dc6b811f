"""The binlog event state machine: the row changes of a binlog range ``[start, end)``, transaction by transaction.

See docs/architecture.md, "The binlog event state machine" and "Binlog offsets". This is the part
of :class:`~.binlog_reader.BinlogRangeReader` that follows the events of a replication stream
once it is open: transaction boundaries, the resumable position, the range's end, a large
transaction's ``emit_from``/``emit_to`` slice, rotations, table maps and rows events, DDL. Its
states only make sense together, so they stay in one class.

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
a rotation inside the range would stop it early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, PartialUpdateRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_provider_mysqlcdc.core.change import RowChange, RowsEventChanges
from airflow_provider_mysqlcdc.core.ddl import CREATE, created_table, table_ddl
from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number
from airflow_provider_mysqlcdc.core.table import TableId, TableSchema
from airflow_provider_mysqlcdc.mysql.server import BinlogReadError
from airflow_provider_mysqlcdc.mysql.table_maps import RowConverter, TableMaps

log = logging.getLogger(__name__)

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

# Transaction states.
_NONE = 0  # between transactions: every event end is a valid resume offset
_GROUP = 1  # BEGIN ... COMMIT: ends at Xid, COMMIT/ROLLBACK query or XA PREPARE
_SINGLE = 2  # standalone statement: ends with its query
_UNKNOWN = 3  # MySQL GTID seen: a BEGIN query makes it a group, any other query is standalone


class BinlogReaderInterrupted(RuntimeError):
    """The replication connection broke inside a transaction; resume from :attr:`BinlogRangeReader.position`."""


def _split_table(name: str) -> tuple[str, str]:
    tid = TableId.parse(name)
    return tid.database, tid.table


class BinlogEventStateMachine:
    """Turns the events of an open replication stream into the row changes of ``tables`` in
    ``[start, end)`` and tracks the last transaction boundary consumed (:attr:`position`).

    The arguments are :class:`~.binlog_reader.BinlogRangeReader`'s (which documents them); the
    reader opens the stream and hands it to :meth:`_events`.
    """

    def __init__(
        self,
        start: BinlogOffset,
        end: BinlogOffset | None,
        tables: Iterable[str] | None,
        *,
        max_transactions: int | None = None,
        max_events: int | None = None,
        convert: RowConverter | None = None,
        timeout: float | None = None,
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
        self.start = start
        self.end = end
        self.max_transactions = max_transactions
        self.max_events = max_events
        self.convert = convert
        self.timeout = timeout
        # Yield a RowChange with op "s" (after = {"kind", "sql"}) for each DDL statement that alters,
        # empties, drops, renames or replaces one of ``tables``: no row event ever shows those.
        self.ddl = ddl
        # Tables with a schema here are decoded by mysql/rows_decoder.py straight into canonical
        # values (several times faster than python-mysql-replication + ``convert``); a table map it
        # cannot decode exactly falls back to the library. ``key_columns``: before images hold only
        # these columns (the stream needs the keys only).
        self.schemas = dict(schemas or {})
        self.added_columns = {t: tuple(c) for t, c in (added_columns or {}).items()}
        # per table, added column -> the value images older than its ADD COLUMN get (else None)
        self.added_defaults = {t: dict(d) for t, d in (added_defaults or {}).items() if d}
        self.key_columns = dict(key_columns or {})
        # per table, old -> new names of renamed columns: images written before a rename carry the old name
        self.renamed_columns = {t: dict(m) for t, m in (renamed_columns or {}).items()}
        # with ``ddl``: also yield a CREATE TABLE of a table this says to capture (created while streaming)
        self.new_tables = new_tables
        # A slice of a large transaction (stream/boundaries.py): only rows events (and DDL) that
        # start in [emit_from, emit_to) are decoded and yielded; the read ends at the first rows
        # event at or after emit_to (stop_reason "slice_end", reached_end True).
        self.emit_from = emit_from
        self.emit_to = emit_to
        self.tables: frozenset[tuple[str, str]] | None = (
            None if tables is None else frozenset(_split_table(t) for t in tables)
        )
        self._maps = TableMaps(self.tables, self.schemas, self.added_columns, self.key_columns, convert,
                               self.renamed_columns, self.added_defaults)  # fmt: skip
        self._stop = threading.Event()
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

    # ------------------------------------------------------------------ boundaries and limits
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

    # ------------------------------------------------------------------ the state machine
    def _events(
        self, stream: BinLogStreamReader, end_key: tuple[int, int] | None, deadline: float | None
    ) -> Iterator[RowChange | RowsEventChanges]:
        """A rows event's rows as one :class:`RowsEventChanges`; a DDL statement as a ``RowChange`` with op 's'."""
        maps = self._maps
        emit_from = None if self.emit_from is None else self.emit_from.sort_key()
        emit_to = None if self.emit_to is None else self.emit_to.sort_key()
        file = self.start.file
        fileno = binlog_file_number(file)
        state = _NONE
        tx_offset: BinlogOffset | None = None

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
                name = maps.table(ev)
                if name is None:
                    continue
                op = "u" if cls is UpdateRowsEvent else ("c" if cls is WriteRowsEvent else "d")
                images = maps.images(ev, name, op, file, start)
                ts = pkt.timestamp
                evpos = (fileno, start)
                assert tx_offset is not None
                if images:
                    yield RowsEventChanges(op, name, images, tx_offset, evpos, ts)
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
                maps.clear()
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
        found = [(d.table, d.kind) for d in table_ddl(ev.query, schema, captured)]
        if self.new_tables is not None:
            created = created_table(ev.query, schema)
            if created is not None and self.new_tables(created):
                found.append((created, CREATE))
        for table, kind in found:
            log.info("DDL on %s at %s:%d: %s", table, file, start, ev.query[:200])
            yield RowChange(
                "s", table, None, {"kind": kind, "sql": ev.query}, tx_offset or BinlogOffset(file, start),
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


__all__ = ["BinlogEventStateMachine", "BinlogReaderInterrupted"]
