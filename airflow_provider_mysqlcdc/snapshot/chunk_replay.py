"""Replay a chunk's own binlog window onto its rows inside the Spark task that read them.

See docs/architecture.md, "The watermark bracket" (per-chunk windows, replayed in the task). A
native-reader chunk has its own ``[LW, HW)`` (``snapshot/native_reader.py``); the changes of that
window to the chunk's keys are what its rows miss or hold stale (``core/chunk_window.py``). Read
in the task, right after HW and before the Parquet file is written, they cost a few kilobytes of
binlog; replayed by the group afterwards, they cost reading and writing the whole file again. The
task's read is a one-shot binlog read (``ONE_SHOT_SERVER_ID``): it needs no replication id of its
own however many tasks run at once.

The replay is an optimisation with a safe way out: a window too large to fold in a task's memory
(a big transaction ran during the read) or in another binlog file than it started, and any failure
of the read, leave the chunk to the group's window replay, which is always correct.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from airflow_provider_mysqlcdc.core.change_block import BlockBuilder, block_schema
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.chunk_window import ChunkWindows
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.mysql import binlog_values
from airflow_provider_mysqlcdc.mysql.binlog_reader import ONE_SHOT_SERVER_ID, BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.rows_decoder import key_image_columns
from airflow_provider_mysqlcdc.spill.bucketed_fold import BucketedFold
from airflow_provider_mysqlcdc.spill.changed_keys import member_mask

log = logging.getLogger(__name__)

#: The most binlog a task replays itself; a larger window (a big transaction during the read) goes
#: to the group's replay, which folds in bounded memory and spills.
TASK_WINDOW_BYTES = 16 << 20


class ReplayedRows(NamedTuple):
    rows: pa.Table  # the chunk's rows as of its HW
    changes: int  # the window's changes that belonged to the chunk


@dataclass(frozen=True)
class ChunkReplay:
    """What a table's chunk tasks need to bring their rows to their own HW (sent to the tasks)."""

    schema: TableSchema
    arrow_schema: pa.Schema  # the staged rows' schema
    locator: ChunkLocator  # over all chunks of the table: a key is placed in the database's order
    split_ids: tuple[int, ...]  # the split id of each chunk index of the Spark job
    pk_cols: tuple[str, ...]
    chunk_cols: tuple[str, ...]
    max_window_bytes: int = TASK_WINDOW_BYTES

    def replay(
        self, settings: ConnectionSettings, rows: pa.Table, index: int, low: BinlogOffset, high: BinlogOffset
    ) -> ReplayedRows | None:
        """Chunk ``index``'s ``rows`` (read inside ``[low, high)``) as of ``high``; None leaves the
        chunk to the group's replay (the reason is logged)."""
        if not high > low:
            return ReplayedRows(rows, 0)
        table = str(self.schema.table)
        if low.file != high.file or high.pos - low.pos > self.max_window_bytes:
            log.info("%s chunk %d: its window %s..%s is left to the group's replay (over %d bytes or two files)",
                     table, self.split_ids[index], low, high, self.max_window_bytes)  # fmt: skip
            return None
        try:
            return self._replay(settings, rows, index, low, high)
        except Exception as exc:  # the group's replay reads the window again and reports its own errors
            log.warning("%s chunk %d: replaying its window %s..%s in the task failed, the group replays it: %s",
                        table, self.split_ids[index], low, high, exc)  # fmt: skip
            return None

    def _replay(
        self, settings: ConnectionSettings, rows: pa.Table, index: int, low: BinlogOffset, high: BinlogOffset
    ) -> ReplayedRows:
        table = str(self.schema.table)
        own = ChunkWindows(self.locator, {self.split_ids[index]: (low, high)})
        before_cols = key_image_columns(self.pk_cols, self.chunk_cols)
        builder = BlockBuilder(block_schema(self.arrow_schema, before_cols))
        convert = binlog_values.binlog_row_converter(self.schema)
        fold = BucketedFold(self.pk_cols, 1)
        chunk_cols = list(self.chunk_cols)
        kept = 0
        with BinlogRangeReader(
            settings, low, high, tables=[table], server_id=ONE_SHOT_SERVER_ID,
            convert=lambda _t, values, none_sources: convert(values, none_sources),
            schemas={table: self.schema}, key_columns={table: before_cols},
        ) as reader:  # fmt: skip
            for ch in reader:
                part = own.part(ch, chunk_cols)
                if part is None or part.op == "s":
                    continue
                tx = part.tx_offset
                builder.add(part.op, tx.file, tx.pos, part.event_pos[0], part.event_pos[1], part.row_index, kept,
                            int(part.commit_ts), part.before, part.after)  # fmt: skip
                kept += 1
        if not kept:
            return ReplayedRows(rows, 0)
        fold.add(builder.build())
        rows = rows.select(self.arrow_schema.names).cast(self.arrow_schema)
        key_schema = pa.schema([self.arrow_schema.field(c) for c in self.pk_cols])
        for bucket in fold.buckets():
            stale = member_mask(rows.select(list(self.pk_cols)), bucket.changed_keys(key_schema), list(self.pk_cols))
            upserts = bucket.upserts.select(self.arrow_schema.names).cast(self.arrow_schema)
            rows = pa.concat_tables([rows.filter(pa.array(~stale)), upserts])
        return ReplayedRows(rows.combine_chunks(), kept)


__all__ = ["TASK_WINDOW_BYTES", "ChunkReplay", "ReplayedRows"]
