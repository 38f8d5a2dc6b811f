"""The task side of the ``mysql_binlog`` source: decode one binlog range, filter it, emit blocks.

Each Spark task reads its sub-range of the micro-batch (a ``RangeSlice`` of
``mysql/binlog_ranges.py``) over its own replication connection, keeps what the handoff rule
admits (:func:`~airflow_provider_mysqlcdc.core.handoff.admit`; ``docs/architecture.md``, "The
handoff"), and yields Arrow batches of output rows (``docs/architecture.md``, "Data flow").

The changes travel as *change blocks* (``core/change_block.py``): each output row carries up to
:data:`BLOCK_ROWS` changes of one table as an Arrow IPC stream whose images are already in the
table's canonical Arrow types, so the driver folds whole blocks with Arrow kernels instead of
decoding every change in Python, which used to cost a large share of the stream's CPU, most of it
on the serial driver.

Output schema (:data:`SCHEMA`)::

    tbl STRING        'db.table'
    kind STRING       'rows' (a block of row changes), 'staged' (blocks a task wrote to a file
                      instead: its output passed its share of ``max_inline_bytes``), 'ddl' (a DDL
                      statement on the table) or 'invalid' (changes whose values do not fit the
                      table's schema in the manifest: the rows after an ALTER the stream has not
                      followed yet)
    rows INT          changes in the block or file (1 for 'ddl')
    first_seq LONG    ``seq`` of the block's first change; ``seq`` orders changes inside the
                      micro-batch: (partition index << 40) | number in the partition; partitions
                      are consecutive binlog ranges, so seq follows the binlog. Not comparable
                      across batches.
    file STRING       binlog file where the transaction of the block's LAST change starts
                      (of the DDL for 'ddl')
    pos LONG          position where that transaction starts (what "p >= HW" compares)
    commit_ts LONG    the latest rows-event timestamp in the block, epoch seconds
    info STRING       for 'ddl': JSON {"kind": alter|truncate|drop|rename|replace, "sql": ...}
                      (stream/schema_follow.py); for 'invalid': JSON {"error": ...}; for 'staged': JSON
                      {"path", "blocks", "rows", "bytes", ...} (stream/staged_blocks.py); null for
                      'rows'
    block BINARY      for 'rows': the Arrow IPC block (columns op, file, pos, file_num, event_pos,
                      row_index, seq, commit_ts, before, after; see core/change_block.py)

:func:`expand_changes` turns collected output back into one dict per change (tests, debugging).

An update whose halves fall in chunks with different HWs is emitted with only the passing half
(``core/handoff.py``): ``before=None`` when its delete-half is filtered, ``op='d'`` and
``after=None`` when its upsert-half is.

A source server that goes away (restart, network) is waited for, up to the reader's
``reconnect_timeout_seconds``: the task resumes its sub-range from the last transaction boundary it
consumed, skipping the rows of the interrupted transaction it already produced — Spark in local
mode never retries a failed task.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pymysql

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.change import RowsEventChanges
from airflow_provider_mysqlcdc.core.change_block import (
    BlockBuilder,
    block_changes,
    block_schema,
    decode_blocks,
    encode_block,
)
from airflow_provider_mysqlcdc.core.ddl import CREATE, shadow_of
from airflow_provider_mysqlcdc.core.handoff import admit
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql import binlog_values
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader, BinlogReaderInterrupted
from airflow_provider_mysqlcdc.mysql.collation import use_server_weights
from airflow_provider_mysqlcdc.mysql.connection import SourceConnectionError
from airflow_provider_mysqlcdc.mysql.rows_decoder import key_image_columns
from airflow_provider_mysqlcdc.storage import LOCAL, LakeStorage
from airflow_provider_mysqlcdc.stream.staged_blocks import StagedBlockWriter, read_staged_blocks

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.stream.spark_source import BinlogPartition, MySqlBinlogStreamReader

log = logging.getLogger(__name__)

SCHEMA = (
    "tbl STRING, kind STRING, rows INT, first_seq BIGINT, file STRING, pos BIGINT, commit_ts BIGINT, info STRING, "
    "block BINARY"
)
#: Changes per block (option ``block_rows``): big enough that the per-block cost (Arrow
#: conversion, IPC, one Spark row) vanishes, small enough that a task streams its output instead of
#: holding it. A sealed block is yielded at once.
BLOCK_ROWS = 8192
#: ``seq`` = partition index << SEQ_SHIFT | row number within the partition.
SEQ_SHIFT = 40
#: How long the source keeps retrying a source server that went away (restart, failover, network)
#: before the query fails; Spark in local mode does not retry a failed task at all.
DEFAULT_RECONNECT_TIMEOUT = 120

# Client/server errors after which a retry can succeed: cannot connect (2002/2003), connection lost
# or gone away (2013/2006/2055), server shutting down (1053), connection killed (1927).
_TRANSIENT_CODES = frozenset({1053, 1927, 2002, 2003, 2006, 2013, 2055})


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is the server or the network going away, as opposed to a real error."""
    if isinstance(exc, BinlogReaderInterrupted | ConnectionError):
        return True
    if isinstance(exc, SourceConnectionError):
        exc = exc.__cause__ or exc
    return isinstance(exc, pymysql.err.MySQLError) and bool(exc.args) and exc.args[0] in _TRANSIENT_CODES


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt``: quick at first, never more than 2 s."""
    return min(2.0, 0.1 * 2**attempt)


class _PerTable(dict):  # type: ignore[type-arg]
    """A table's value, made by ``make(table)`` the first time it is asked for."""

    def __init__(self, make: Callable[[str], Any]):
        super().__init__()
        self.make = make

    def __missing__(self, table: str) -> Any:
        value = self[table] = self.make(table)
        return value


def read_partition(reader: MySqlBinlogStreamReader, part: BinlogPartition) -> Iterator[pa.RecordBatch]:
    """Decode one sub-range, filter it, yield Arrow batches of change blocks (:data:`SCHEMA`)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(reader.schema, timezone="UTC")
    use_server_weights(reader._settings())  # keys of server-ordered collations are placed by the source
    manifest = reader.manifest
    flt = manifest.handoff_filter()
    schemas = manifest.schemas()
    added = {t: tuple(manifest.tables[t].optional_columns) for t in schemas}
    defaults = {t: manifest.tables[t].added_defaults for t in schemas}  # what images older than an ADD COLUMN get
    renamed = {t: e.renamed_columns for t, e in manifest.tables.items() if e.renamed_columns}
    live = {t for t, e in manifest.tables.items() if e.ended_at is None}

    def new_tables(name: str) -> bool:
        """A table created while streaming is captured if the selection selects it or it is an online
        schema change's shadow copy of a captured table (docs/architecture.md, "Schema changes")."""
        return manifest.selection.selects(name) or shadow_of(name) in live

    # made when the range first touches a table: a batch reads a few of hundreds of captured tables
    converters = _PerTable(lambda t: binlog_values.binlog_row_converter(schemas[t], added[t], defaults[t]))
    key_cols = {t: tuple(m.chunk_key_columns) for t, m in manifest.tables.items()}
    # a table with a changelog keeps every column of its before images (core/changelog.py)
    full_before = {t: reader.before_image == "full" or manifest.tables[t].changelog for t in schemas}
    block_rows = reader.block_rows
    before_cols = {t: key_image_columns(s.primary_key, key_cols[t]) for t, s in schemas.items()}
    builders = _PerTable(lambda t: BlockBuilder(block_schema(cdc_types.arrow_schema(schemas[t]), before_cols[t],
                                                             full_before[t])))  # fmt: skip
    key_only = {t: c for t, c in before_cols.items() if not full_before[t]}  # the decoder's before images

    def convert(table: str, values: dict[str, Any], none_sources: Any) -> dict[str, Any]:
        return converters[table](values, none_sources)

    start, end = BinlogOffset.from_dict(part.start), BinlogOffset.from_dict(part.end)
    emit_from = BinlogOffset.from_dict(part.emit_from) if part.emit_from else None
    emit_to = BinlogOffset.from_dict(part.emit_to) if part.emit_to else None
    # A table whose capture ended (DROP/RENAME, stream/schema_follow.py) before this range is not
    # read at all: a table created again under its name may have another shape.
    read_tables = [t for t in reader.tables if (e := manifest.tables[t].ended_at) is None or not e < start]
    # Output beyond max_inline_bytes goes to staged files instead of through Spark (see
    # stream/staged_blocks.py); None when the query has no staging directory.
    staged = StagedBlockWriter(reader.staging, part.batch, part.index, reader.storage) if reader.staging else None
    inline_bytes = 0
    decoded = 0
    out: list[dict[str, Any]] = []  # block rows waiting to be yielded
    first_seq: dict[str, int] = {}
    last_tx_of: dict[str, BinlogOffset] = {}
    max_ts: dict[str, int] = {}
    seq = part.index << SEQ_SHIFT
    last_tx: BinlogOffset | None = None
    tx_key: tuple[int, int] = (0, 0)

    def seal(table: str) -> None:
        nonlocal inline_bytes
        b = builders[table]
        tx = last_tx_of[table]
        row = {"tbl": table, "kind": "rows", "rows": len(b), "first_seq": first_seq.pop(table), "file": tx.file,
               "pos": tx.pos, "commit_ts": max_ts.pop(table), "info": None, "block": None}  # fmt: skip
        try:
            block = b.build()
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            # Values decoded with the manifest's schema do not fit it: rows after an ALTER (e.g. a
            # widening) that this batch's DDL marker — possibly in another task — announces. The
            # driver stops the batch at the DDL before applying anything, or fails with this.
            row["kind"], row["info"] = "invalid", json.dumps({"error": f"{type(exc).__name__}: {exc}"})
            out.append(row)
            return
        if staged is not None:
            staged.report_progress(decoded, str(tx))
            if staged.active or (part.inline_bytes is not None and inline_bytes + block.nbytes > part.inline_bytes):
                staged.write(table, block, row["first_seq"], tx, row["commit_ts"])
                return
        row["block"] = encode_block(block)
        inline_bytes += len(row["block"])
        out.append(row)

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pylist(out, schema=arrow_schema)
        out.clear()
        return batch

    # A lost connection (server restart, network) resumes from the reader's last boundary; rows of
    # the transaction that was being read when it broke are read again and skipped up to the count
    # already handled, so the task's output has every change exactly once.
    pos = start
    skip_tx: BinlogOffset | None = None
    skip_n = 0
    deadline: float | None = None
    attempt = 0
    while True:
        rr = BinlogRangeReader(reader._settings(), pos, end, read_tables, part.server_id, blocking=False,
                               convert=convert, ddl=True, schemas=schemas, added_columns=added, added_defaults=defaults,
                               renamed_columns=renamed,
                               new_tables=new_tables,
                               key_columns=key_only, emit_from=emit_from, emit_to=emit_to)  # fmt: skip
        cur_tx: BinlogOffset | None = None
        n_in_tx = 0
        failure: Exception
        try:
            with rr:
                for item in rr.events():
                    table = item.table
                    tx = item.tx_offset
                    if tx is not last_tx:  # one BinlogOffset object per transaction
                        last_tx, tx_key = tx, tx.sort_key()
                    if tx is not cur_tx:
                        cur_tx, n_in_tx = tx, 0
                    if not isinstance(item, RowsEventChanges):  # a DDL statement (op 's')
                        n_in_tx += 1
                        if skip_tx is not None and n_in_tx <= skip_n and tx == skip_tx:
                            continue  # handled before the connection broke
                        if item.after["kind"] != CREATE:  # type: ignore[index]
                            if admit(item, flt, key_cols[table], tx_key) is None:  # the handoff rule
                                continue
                        # (a table created while streaming is not captured yet: the driver decides)
                        if table in first_seq:  # keep the table's changes before the DDL in order
                            seal(table)
                        out.append({"tbl": table, "kind": "ddl", "rows": 1, "first_seq": seq, "file": tx.file,
                                    "pos": tx.pos, "commit_ts": int(item.commit_ts), "info": json.dumps(item.after),
                                    "block": None})  # fmt: skip
                        seq += 1
                        continue
                    handled = n_in_tx
                    n_in_tx += len(item)
                    if skip_tx is not None and handled < skip_n and tx == skip_tx:
                        item = item.without_first(min(len(item), skip_n - handled))  # handled before the break
                    tf = flt.table(table)
                    if tf is None or not item.images:
                        continue
                    evpos = item.event_pos
                    ts = int(item.commit_ts)
                    whole = tf.admits_every_row(tx_key)  # the common case: the event's rows go in whole
                    if not whole:  # the handoff rule (core/handoff.py), row by row
                        keys = key_cols[table]
                        changes = list(item.changes())
                        if tf.locator.order.asks_server:  # learn the event's key weights in one round
                            tf.locator.order.prefetch([[img[c] for c in keys] for ch in changes
                                                       for img in (ch.before, ch.after) if img])  # fmt: skip
                        kept = [k for ch in changes if (k := admit(ch, flt, keys, tx_key))]
                        if not kept:
                            continue
                    b = builders[table]
                    if table not in first_seq:
                        first_seq[table] = seq
                        max_ts[table] = 0
                    if ts > max_ts[table]:
                        max_ts[table] = ts
                    last_tx_of[table] = tx
                    if whole:
                        befores, afters = item.befores_afters()
                        n = len(afters)
                        b.extend(item.op, tx.file, tx.pos, evpos[0], evpos[1], item.first_row, seq, ts, befores, afters)
                        seq += n
                        decoded += n
                    else:
                        for k in kept:
                            b.add(k.op, tx.file, tx.pos, evpos[0], evpos[1], k.row_index, seq, ts, k.before, k.after)
                            seq += 1
                        decoded += len(kept)
                    if len(b) >= block_rows:
                        seal(table)
                        if out:
                            yield flush()
            if rr.reached_end:
                break
            # A non-blocking read that ends short of ``end`` (the server closed the dump) would drop
            # the rest of the range: resume, and fail if it keeps happening.
            failure = RuntimeError(
                f"binlog reader for {start} -> {end} stopped at {rr.position} ({rr.stop_reason}) before the end "
                "of its range"
            )
        except Exception as exc:
            if not is_transient(exc):
                raise
            failure = exc
        now = time.monotonic()
        if rr.position > pos:  # progress since the last break: a new outage gets the full timeout
            deadline, attempt = None, 0
        deadline = deadline if deadline is not None else now + reader.reconnect_timeout
        if now >= deadline:
            raise failure
        if cur_tx is not None and cur_tx >= rr.position:  # broke inside cur_tx: it is read again
            skip_n = max(skip_n, n_in_tx) if cur_tx == skip_tx else n_in_tx
            skip_tx = cur_tx
        pos = max(pos, rr.position)
        log.warning("mysql_binlog: reading %s -> %s broke at %s (%s); resuming", start, end, pos, failure)
        time.sleep(backoff(attempt))
        attempt += 1
    for table in list(first_seq):
        seal(table)
    if staged is not None and staged.active:
        for f in staged.close():
            out.append({"tbl": f["table"], "kind": "staged",
                        "rows": f["rows"], "first_seq": f["first_seq"], "file": f["file"], "pos": f["pos"],
                        "commit_ts": f["commit_ts"], "info": json.dumps(f), "block": None})  # fmt: skip
    if out:
        yield flush()


def expand_changes(data: pa.Table, storage: LakeStorage = LOCAL) -> list[dict[str, Any]]:
    """Collected :data:`SCHEMA` output as one dict per change, in ``seq`` order.

    A change: ``op, tbl, before, after, file, pos, file_num, event_pos, row_index, seq, commit_ts``
    (images as dicts); a DDL: ``op='s'``, ``after`` = its ``{"kind", "sql"}``, no event position.
    """
    out: list[dict[str, Any]] = []
    for row in data.to_pylist():
        if row["kind"] == "invalid":
            raise ValueError(f"changes of {row['tbl']} could not be converted: {json.loads(row['info'])['error']}")
        if row["kind"] == "ddl":
            out.append({"op": "s", "tbl": row["tbl"], "before": None, "after": json.loads(row["info"]),
                        "file": row["file"], "pos": row["pos"], "file_num": None, "event_pos": None,
                        "row_index": 0, "seq": row["first_seq"], "commit_ts": row["commit_ts"]})  # fmt: skip
            continue
        if row["kind"] == "staged":
            block = pa.Table.from_batches(list(read_staged_blocks(json.loads(row["info"])["path"], storage)))
        else:
            block = decode_blocks([row["block"]])
        assert block is not None
        out.extend({"tbl": row["tbl"], **ch} for ch in block_changes(block))
    out.sort(key=lambda c: c["seq"])
    return out
