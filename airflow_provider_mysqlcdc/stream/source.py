"""``mysql_binlog``: a PySpark Python streaming data source over the MySQL/MariaDB binlog.

Each micro-batch is a binlog range ``[start, end)`` between two transaction boundaries (DESIGN §3
"Binlog offset"). The range is cut into up to ``readers`` transaction-aligned sub-ranges of similar
byte size, and each is decoded by its own Spark task with its own replication ``server_id`` —
decoding is the streaming bottleneck (DESIGN §3, ~20k rows/s per core), so one reader per batch
would cap the stream at one core. The stream handoff filter (per chunk HW, per image) is applied in
the tasks, row images travel as :mod:`cdc.row_codec` JSON.

Output schema (one for every table; :data:`SCHEMA`)::

    op STRING         'c' insert, 'u' update, 'd' delete
    tbl STRING        'db.table'
    before STRING     row_codec JSON of the before image, or null
    after STRING      row_codec JSON of the after image, or null
    file STRING       binlog file where the change's transaction starts
    pos LONG          position where the transaction starts (what "p >= HW" compares)
    file_num INT      numeric suffix of the rows event's file
    event_pos LONG    start of the rows event
    row_index INT     row within the rows event
    seq LONG          order inside the micro-batch: (partition index << 40) | row number in the
                      partition; partitions are consecutive binlog ranges, so seq follows
                      (file_num, event_pos, row_index). Not comparable across batches.
    commit_ts LONG    rows event timestamp, epoch seconds

An update whose halves fall in chunks with different HWs is emitted with only the passing half
(DESIGN §3, ``cdc/split_filter.py``): ``before=None`` when its delete-half is filtered, ``op='d'``
and ``after=None`` when its upsert-half is.

Offsets are ``{"file": ..., "pos": ...}`` at transaction boundaries. Where the pieces run (Spark
4.2, verified by ``tests/integration/test_stream_source.py``):

* ``initialOffset/latestOffset/partitions/commit/prepareForTriggerAvailableNow`` run in one
  long-lived Python process on the driver: it keeps one plain connection for ``SHOW MASTER
  STATUS`` / ``SHOW BINARY LOGS`` / ``SHOW BINLOG EVENTS``;
* ``read()`` runs in Python workers on a pickled copy of a reader built in a separate planning
  process; it holds no connection and builds the filter from the manifest *content* it carries
  (the manifest file may live where executors cannot read it).

Trigger semantics: ``latestOffset(start, limit)`` implements admission control (Spark 4.2):
``max_events_per_trigger`` is reported as ``ReadMaxRows`` (counted in binlog *events*, the unit
``SHOW BINLOG EVENTS`` gives cheaply, not row changes) or ``max_bytes_per_trigger`` as
``ReadMaxBytes``; when both are set the other one is applied on top of the limit Spark passes (Spark
has no composite limit). ``ReadAllAvailable`` (Trigger.Once) ignores both. The reader implements
``SupportsTriggerAvailableNow``, so ``trigger(availableNow=True)`` runs capped batches up to the
position seen at start and stops — without the mixin Spark falls back to one uncapped batch.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from airflow_provider_mysqlcdc.cdc import types as cdc_types
from airflow_provider_mysqlcdc.cdc.offset import BinlogOffset, binlog_file_number
from airflow_provider_mysqlcdc.cdc.row_codec import encode_row
from airflow_provider_mysqlcdc.source.binlog import BinlogRangeReader
from airflow_provider_mysqlcdc.source.connection import ConnectionSettings, ServerIdAllocator
from airflow_provider_mysqlcdc.source.server import BinlogUnavailableError, binlog_files, current_offset
from airflow_provider_mysqlcdc.stream.manifest import (
    chunk_key_columns_from_manifest,
    manifest_from_json,
    manifest_start_offset,
    split_filter_from_manifest,
    table_schemas_from_manifest,
)

log = logging.getLogger(__name__)

NAME = "mysql_binlog"
SCHEMA = (
    "op STRING, tbl STRING, before STRING, after STRING, file STRING, pos BIGINT, file_num INT, "
    "event_pos BIGINT, row_index INT, seq BIGINT, commit_ts BIGINT"
)
#: Rows per yielded Arrow batch: big enough to amortise the per-batch cost, small enough to stream.
ARROW_BATCH_ROWS = 4096
#: A sub-range smaller than this is not worth its own replication connection (tunable by option).
DEFAULT_MIN_BYTES_PER_READER = 256 * 1024
#: ``seq`` = partition index << SEQ_SHIFT | row number within the partition.
SEQ_SHIFT = 40
SERVER_ID_SPAN = 1000

# SHOW BINLOG EVENTS event types that mark a transaction boundary.
_TX_START_TYPES = frozenset({"Gtid", "Anonymous_Gtid"})  # boundary at the event's start
_TX_END_TYPES = frozenset({"Xid", "XA_prepare"})  # boundary at the event's end
_WINDOW = 256  # events fetched per look-back window
_PAGE = 1000  # events fetched per forward page


# ============================================================================ boundaries (driver)
@dataclass(frozen=True)
class _Event:
    pos: int
    type: str
    end: int
    info: str


class BinlogBoundaries:
    """Transaction boundaries from ``SHOW BINLOG EVENTS``, without decoding a single row.

    The server walks its own file (measured ~8M events/s skipped server-side with ``LIMIT k, 1``),
    so finding "the k-th event after ``pos``" costs a round trip, and only small windows of event
    headers ever travel. A boundary is the start of a GTID event (MariaDB always writes one; MySQL
    a GTID or anonymous GTID) or the end of an ``Xid`` / ``XA_prepare`` / ``COMMIT`` / ``ROLLBACK``
    event: exactly the positions :class:`~source.binlog.BinlogRangeReader` stops at and starts from.
    ``SHOW BINLOG EVENTS ... FROM pos`` needs ``pos`` to be an event start: every base used here is
    a boundary, a file start (4), or a position the server itself listed.
    """

    def __init__(self, conn: Any):
        self.conn = conn
        self.queries = 0  # round trips, for tests and logs

    # ---------------------------------------------------------------- primitives
    def events(self, file: str, base: int, skip: int, count: int) -> list[_Event]:
        self.queries += 1
        with self.conn.cursor() as cur:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT %s, %s", (file, int(base), int(skip), int(count)))
            return [_Event(int(r[1]), str(r[2]), int(r[4]), str(r[5] or "")) for r in cur.fetchall()]

    def event(self, file: str, base: int, k: int) -> _Event | None:
        """The k-th event (0-based) from ``base``, or None past the end of the file."""
        got = self.events(file, base, k, 1)
        return got[0] if got else None

    def count_at_or_before(self, file: str, base: int, target: int, known_above: int | None = None) -> int:
        """How many events from ``base`` start at a position <= ``target`` (>= 1: ``base`` itself).

        Exponential probing, then bisection down to a window of :data:`_WINDOW` events that is
        read in one query. ``known_above`` is an index already known to start after ``target``.
        """
        lo = 0  # index known to start <= target
        hi = known_above  # index known to start > target (or not to exist)
        step = _WINDOW
        while hi is None:
            k = lo + step
            e = self.event(file, base, k)
            if e is None or e.pos > target:
                hi = k
            else:
                lo = k
                step *= 4
        while hi - lo > _WINDOW:
            mid = (lo + hi) // 2
            e = self.event(file, base, mid)
            if e is None or e.pos > target:
                hi = mid
            else:
                lo = mid
        window = self.events(file, base, lo, hi - lo)
        n = lo
        for e in window:
            if e.pos > target:
                break
            n += 1
        return n

    # ---------------------------------------------------------------- boundaries
    @staticmethod
    def _boundaries_in(events: list[_Event], upto: int | None = None) -> list[int]:
        """Boundary positions contributed by ``events`` (a consecutive run), ascending, <= ``upto``."""
        out = []
        for e in events:
            if e.type in _TX_START_TYPES:
                b = e.pos
            elif e.type in _TX_END_TYPES or (e.type == "Query" and e.info.strip().upper() in ("COMMIT", "ROLLBACK")):
                b = e.end
            else:
                continue
            if upto is None or b <= upto:
                out.append(b)
        return out

    def last_boundary_before_index(self, file: str, base: int, k: int, pos_k: int) -> int | None:
        """The last boundary > ``base`` and <= the start of event ``k`` (i.e. after whole events
        ``0..k-1``); None if the first transaction after ``base`` does not end by then."""
        width = _WINDOW
        while True:
            lo = max(0, k - width)
            events = self.events(file, base, lo, k - lo + 1)
            found = [b for b in self._boundaries_in(events, pos_k) if b > base]
            if found:
                return found[-1]
            if lo == 0:
                return None
            width *= 8

    def first_boundary_from(self, file: str, pos: int, after: int, files: list[tuple[str, int]]) -> BinlogOffset | None:
        """The first boundary > ``after`` found scanning forward from event start ``pos``; a file
        end without one gives the next file's start; None at the end of the last file."""
        cur = pos
        while True:
            events = self.events(file, cur, 0, _PAGE)
            for e in events:
                if e.type == "Rotate":
                    nxt = e.info.split(";", 1)[0].strip()
                    if nxt:
                        return BinlogOffset(nxt, 4)
                found = [b for b in self._boundaries_in([e]) if b > after]
                if found:
                    return BinlogOffset(file, found[0])
            if len(events) < _PAGE:
                nxt_file = _next_file(files, file)
                return BinlogOffset(nxt_file, 4) if nxt_file else None
            cur = events[-1].end


def _next_file(files: list[tuple[str, int]], file: str) -> str | None:
    n = binlog_file_number(file)
    later = sorted((binlog_file_number(f), f) for f, _ in files if binlog_file_number(f) > n)
    return later[0][1] if later else None


def _segments(
    files: list[tuple[str, int]], start: BinlogOffset, end: BinlogOffset
) -> list[tuple[str, int, int]]:
    """``(file, from, to)`` pieces of ``[start, end)``, one per binlog file, in order."""
    out = []
    for f, size in sorted(files, key=lambda x: binlog_file_number(x[0])):
        n = binlog_file_number(f)
        if n < start.file_number or n > end.file_number:
            continue
        lo = start.pos if n == start.file_number else 4
        hi = end.pos if n == end.file_number else size
        if hi > lo:
            out.append((f, lo, hi))
    return out


def capped_end(
    bounds: BinlogBoundaries,
    files: list[tuple[str, int]],
    start: BinlogOffset,
    head: BinlogOffset,
    max_events: int | None,
    max_bytes: int | None,
) -> BinlogOffset:
    """The end of a batch from ``start``: the last boundary within the caps, never past ``head``.

    A transaction bigger than a cap forms a batch by itself (progress is guaranteed); a batch may
    span rotations (the caps are counted across files).
    """
    ev_left = max_events if max_events else math.inf
    by_left = max_bytes if max_bytes else math.inf
    consumed = False
    for f, base, seg_end in _segments(files, start, head):
        n_events: int | None = None
        k_cap: int | None = None
        pos_cap = 0
        if ev_left is not math.inf:
            e = bounds.event(f, base, int(ev_left))
            if e is not None and e.pos < seg_end:
                k_cap, pos_cap = int(ev_left), e.pos
        if by_left is not math.inf and base + by_left < seg_end:
            target = base + int(by_left)
            m = bounds.count_at_or_before(f, base, target, known_above=k_cap if pos_cap > target else None)
            k_b = m - 1  # events 0..k_b-1 end at or before target: event k_b starts <= target
            if k_cap is None or k_b < k_cap:
                e = bounds.event(f, base, k_b)
                assert e is not None
                k_cap, pos_cap = k_b, e.pos
        if k_cap is None:
            if binlog_file_number(f) == head.file_number:
                return head
            if ev_left is not math.inf:
                n_events = bounds.count_at_or_before(f, base, seg_end - 1, known_above=int(ev_left))
                ev_left -= n_events
            by_left -= seg_end - base
            consumed = True
            continue
        b = bounds.last_boundary_before_index(f, base, k_cap, pos_cap) if k_cap > 0 else None
        if b is not None:
            return min(BinlogOffset(f, b), head)
        if consumed:  # earlier files fill the batch; end it at this file's start
            return BinlogOffset(f, base)
        # The first transaction alone exceeds the cap: it is the batch.
        nxt = bounds.first_boundary_from(f, base, base, files)
        return head if nxt is None else min(nxt, head)
    return head


def split_range(
    bounds: BinlogBoundaries,
    files: list[tuple[str, int]],
    start: BinlogOffset,
    end: BinlogOffset,
    parts: int,
    min_bytes: int,
) -> list[BinlogOffset]:
    """Cut points (boundaries strictly inside ``(start, end)``) for up to ``parts`` sub-ranges of
    similar byte size. A target with no boundary left in its file cuts at the next file's start."""
    segs = _segments(files, start, end)
    total = sum(hi - lo for _, lo, hi in segs)
    if min_bytes > 0:
        parts = min(parts, max(1, total // min_bytes))
    if parts <= 1 or not segs:
        return []
    cuts: set[BinlogOffset] = set()
    for i in range(1, parts):
        g = total * i // parts
        for seg_file, lo, hi in segs:
            if g < hi - lo:
                f, target = seg_file, lo + g
                break
            g -= hi - lo
        else:  # pragma: no cover - g < total by construction
            continue
        m = bounds.count_at_or_before(f, lo, target)
        e = bounds.event(f, lo, m - 1)
        assert e is not None
        b = bounds.first_boundary_from(f, e.pos, max(lo, e.pos - 1), files)
        if b is not None and start < b < end:
            cuts.add(b)
    return sorted(cuts)


# ============================================================================ Spark classes
class BinlogPartition(InputPartition):
    """One transaction-aligned sub-range of a micro-batch, with the server_id its reader uses."""

    def __init__(self, index: int, start: dict[str, Any], end: dict[str, Any], server_id: int):
        super().__init__((index, start, end, server_id))
        self.index = index
        self.start = start
        self.end = end
        self.server_id = server_id

    def __repr__(self) -> str:
        return f"BinlogPartition({self.index}, {self.start} -> {self.end}, server_id={self.server_id})"


def _int_option(options: Any, name: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name}={raw!r} of the {NAME} source must be an integer") from None
    if value < minimum:
        raise ValueError(f"option {name}={value} of the {NAME} source must be >= {minimum}")
    return value


def _read_manifest(path: str) -> dict[str, Any]:
    """Read the manifest file (local path or fsspec URL) on the driver."""
    from fsspec.core import url_to_fs

    fs, p = url_to_fs(path)
    try:
        with fs.open(p, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"stream manifest {path} does not exist: build it from the snapshot (the stream operator writes it)"
        ) from None
    return manifest_from_json(text)


class MySqlBinlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans binlog micro-batches on the driver and decodes their sub-ranges in the tasks."""

    def __init__(self, schema: StructType, options: Any, default_readers: int | None = None):
        self.schema = schema
        src = options.get("source")
        if not src:
            raise ValueError(f"the {NAME} source needs option 'source' (ConnectionSettings JSON)")
        self.source = json.loads(src) if isinstance(src, str) else dict(src)
        path = options.get("manifest")
        if not path:
            raise ValueError(f"the {NAME} source needs option 'manifest' (path of the stream manifest JSON)")
        self.manifest_path = str(path)
        # Read once, on the driver: the content travels to the tasks with the pickled reader.
        self.manifest = _read_manifest(self.manifest_path)
        self.tables = sorted(self.manifest["tables"])
        self.max_events = _int_option(options, "max_events_per_trigger", None, 1)
        self.max_bytes = _int_option(options, "max_bytes_per_trigger", None, 1)
        fallback = default_readers or os.cpu_count() or 1
        self.readers = _int_option(options, "readers", max(1, int(fallback)), 1) or 1
        self.min_bytes_per_reader = _int_option(options, "min_bytes_per_reader", DEFAULT_MIN_BYTES_PER_READER, 0) or 0
        base = _int_option(options, "server_id_base", None, 1)
        settings = ConnectionSettings.from_dict(self.source)
        self.server_id_range = (base, base + SERVER_ID_SPAN - 1) if base else tuple(settings.server_id_range)
        # Driver-only state, created on first use and never pickled.
        self._conn: Any = None
        self._ids: ServerIdAllocator | None = None
        self._target: BinlogOffset | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None
        state["_ids"] = None
        return state

    # ---------------------------------------------------------------- driver side
    def _settings(self) -> ConnectionSettings:
        return ConnectionSettings.from_dict(self.source)

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self._settings().connect()
        else:
            self._conn.ping(reconnect=True)
        return self._conn

    def _files_checked(self, conn: Any, start: BinlogOffset) -> list[tuple[str, int]]:
        """SHOW BINARY LOGS, raising the actionable purge error if ``start``'s file is gone."""
        files = binlog_files(conn)
        if start.file_number not in {binlog_file_number(f) for f, _ in files}:
            oldest = files[0][0] if files else "none"
            raise BinlogUnavailableError(
                f"binlog file {start.file} (the stream's offset {start}) has been purged from the source "
                f"(oldest kept: {oldest}). The changes after that point are lost to CDC: re-snapshot the "
                "captured tables (trigger the DAG with backfill_tables, or startup_mode=initial) and start "
                "the stream with a new checkpoint; raise the server's binlog retention "
                "(binlog_expire_logs_seconds / expire_logs_days) so the stream's offset stays available"
            )
        return files

    def _head(self, conn: Any, start: BinlogOffset) -> BinlogOffset:
        head = current_offset(conn)
        head = BinlogOffset(head.file, head.pos)  # the GTID set is not part of our offsets
        if head < start:
            raise BinlogUnavailableError(
                f"the source's binlog is at {head}, before the stream's offset {start}: the binlog was reset "
                "(RESET MASTER) or the connection points at another server. Re-snapshot the captured tables "
                "and start the stream with a new checkpoint"
            )
        return head

    def initialOffset(self) -> dict[str, Any]:
        off = manifest_start_offset(self.manifest)
        return {"file": off.file, "pos": off.pos}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_events:
            return ReadMaxRows(self.max_events)
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        conn = self._connection()
        head = current_offset(conn)
        self._target = BinlogOffset(head.file, head.pos)
        log.info("%s: availableNow target %s", NAME, self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = BinlogOffset.from_dict(start)
        conn = self._connection()
        files = self._files_checked(conn, begin)
        head = self._head(conn, begin)
        if self._target is not None:
            head = min(head, self._target)
        if head <= begin:
            return start
        max_events, max_bytes = None, None
        if isinstance(limit, ReadMaxRows):
            max_events, max_bytes = int(limit.max_rows), self.max_bytes
        elif isinstance(limit, ReadMaxBytes):
            max_events, max_bytes = self.max_events, int(limit.max_bytes)
        elif not isinstance(limit, ReadAllAvailable):
            max_events, max_bytes = self.max_events, self.max_bytes
        end = head
        if max_events or max_bytes:
            end = capped_end(BinlogBoundaries(conn), files, begin, head, max_events, max_bytes)
        if end <= begin:  # cannot happen with a sane binlog; never move backwards
            return start
        return {"file": end.file, "pos": end.pos}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        try:
            head = current_offset(self._connection())
        except Exception:  # status reporting must never fail the query
            return None
        return {"file": head.file, "pos": head.pos}

    def _next_server_id(self) -> int:
        if self._ids is None:
            self._ids = ServerIdAllocator(self.server_id_range)  # type: ignore[arg-type]
        return self._ids.next()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[BinlogPartition]:
        begin, stop = BinlogOffset.from_dict(start), BinlogOffset.from_dict(end)
        if stop <= begin:
            return []
        conn = self._connection()
        files = self._files_checked(conn, begin)
        cuts: list[BinlogOffset] = []
        if self.readers > 1:
            cuts = split_range(BinlogBoundaries(conn), files, begin, stop, self.readers, self.min_bytes_per_reader)
        points = [begin, *cuts, stop]
        return [
            BinlogPartition(
                i, {"file": a.file, "pos": a.pos}, {"file": b.file, "pos": b.pos}, self._next_server_id()
            )
            for i, (a, b) in enumerate(itertools.pairwise(points))
        ]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the binlog is read, never consumed. Logged for operators."""
        log.debug("%s: committed %s", NAME, end)

    def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection
                pass

    # ---------------------------------------------------------------- task side
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, BinlogPartition)
        return _read_partition(self, partition)


def _read_partition(reader: MySqlBinlogStreamReader, part: BinlogPartition) -> Iterator[pa.RecordBatch]:
    """Decode one sub-range, filter it, yield Arrow batches of exactly the Spark schema."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(reader.schema, timezone="UTC")
    manifest = reader.manifest
    flt = split_filter_from_manifest(manifest)
    schemas = table_schemas_from_manifest(manifest)
    converters = {t: cdc_types.binlog_row_converter(s) for t, s in schemas.items()}
    key_cols = {t: tuple(c) for t, c in chunk_key_columns_from_manifest(manifest).items()}
    max_hw = {t: flt.max_high_watermark(t).sort_key() for t in schemas}

    def convert(table: str, values: dict[str, Any], none_sources: Any) -> dict[str, Any]:
        return converters[table](values, none_sources)

    start, end = BinlogOffset.from_dict(part.start), BinlogOffset.from_dict(part.end)
    cols: list[list[Any]] = [[] for _ in range(len(arrow_schema))]
    (c_op, c_tbl, c_before, c_after, c_file, c_pos, c_fnum, c_epos, c_row, c_seq, c_ts) = cols
    seq = part.index << SEQ_SHIFT
    last_tx: BinlogOffset | None = None
    tx_key: tuple[int, int] = (0, 0)

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(cols, arrow_schema, strict=True)], schema=arrow_schema
        )
        for c in cols:
            c.clear()
        return batch

    reader_ = BinlogRangeReader(
        reader._settings(), start, end, reader.tables, part.server_id, blocking=False, convert=convert
    )
    with reader_:
        for ch in reader_:
            table = ch.table
            tx = ch.tx_offset
            if tx is not last_tx:
                last_tx, tx_key = tx, tx.sort_key()
            op, before, after = ch.op, ch.before, ch.after
            if tx_key < max_hw[table]:  # inside the handoff window: filter per image
                cols_k = key_cols[table]
                if op == "c":
                    if not flt.emits(table, [after[c] for c in cols_k], tx):  # type: ignore[index]
                        continue
                elif op == "d":
                    if not flt.emits(table, [before[c] for c in cols_k], tx):  # type: ignore[index]
                        continue
                else:
                    del_ok = flt.emits(table, [before[c] for c in cols_k], tx)  # type: ignore[index]
                    ups_ok = flt.emits(table, [after[c] for c in cols_k], tx)  # type: ignore[index]
                    if not del_ok and not ups_ok:
                        continue
                    if not ups_ok:
                        op, after = "d", None
                    elif not del_ok:
                        before = None
            c_op.append(op)
            c_tbl.append(table)
            c_before.append(encode_row(before))
            c_after.append(encode_row(after))
            c_file.append(tx.file)
            c_pos.append(tx.pos)
            c_fnum.append(ch.event_pos[0])
            c_epos.append(ch.event_pos[1])
            c_row.append(ch.row_index)
            c_seq.append(seq)
            c_ts.append(int(ch.commit_ts))
            seq += 1
            if len(c_op) >= ARROW_BATCH_ROWS:
                yield flush()
    if not reader_.reached_end:
        # A non-blocking read that stopped short of ``end`` would silently drop the rest of the range.
        raise RuntimeError(
            f"binlog reader for {start} -> {end} stopped at {reader_.position} ({reader_.stop_reason}) before "
            "the end of its range; the task fails so Spark retries it"
        )
    if c_op:
        yield flush()


class MySqlBinlogDataSource(DataSource):
    """``spark.readStream.format("mysql_binlog")``: see the module docstring for options and schema."""

    #: Set by :func:`register` from ``spark.sparkContext.defaultParallelism``; the planning process
    #: has no SparkContext to ask.
    default_readers: int | None = None

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MySqlBinlogStreamReader(schema, self.options, self.default_readers)


def _check_worker_python(python: str) -> None:
    """The Python Spark starts for the planning and read processes must import this package."""
    probe = "import pyarrow, pymysql, pymysqlreplication, airflow_provider_mysqlcdc.cdc.row_codec"
    try:
        res = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(
            f"Spark's Python ({python}) cannot be started ({exc}): set PYSPARK_PYTHON to the Python that has "
            "airflow-provider-mysqlcdc installed"
        ) from exc
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(
            f"Spark's Python workers ({python}) cannot import the {NAME} source ({last}). Set PYSPARK_PYTHON "
            "(or spark.pyspark.python) to the Python that has airflow-provider-mysqlcdc, pyarrow and "
            "mysql-replication installed, before the SparkContext starts"
        )


def register(spark: Any, default_readers: int | None = None, check_python: bool = True) -> None:
    """Register the ``mysql_binlog`` source with ``spark``.

    The registered class carries ``default_readers`` (default: ``defaultParallelism``, the cores of
    the application), used when a query sets no ``readers`` option. It is a subclass made here and
    pickled by value, because the planning process cannot ask the SparkContext. ``check_python``
    starts Spark's Python once to make sure it can import this package: otherwise the first batch
    fails with a bare ``ModuleNotFoundError`` deep in a Python worker traceback.
    """
    sc = spark.sparkContext
    if check_python:
        _check_worker_python(getattr(sc, "pythonExec", None) or "python3")
    readers = default_readers
    if readers is None:
        try:
            readers = int(sc.defaultParallelism)
        except Exception:  # not a classic session
            readers = None
    cls = type(
        "MySqlBinlogDataSourceRegistered",
        (MySqlBinlogDataSource,),
        {"default_readers": max(1, readers) if readers else None, "__module__": __name__},
    )
    spark.dataSource.register(cls)
