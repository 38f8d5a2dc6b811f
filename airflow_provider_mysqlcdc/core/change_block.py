"""Change blocks: a micro-batch's row changes of one table as typed Arrow columns, and their fold.

Why blocks: the stream's tasks decode the binlog in parallel, but the driver applies every batch
alone (Structured Streaming runs ``foreachBatch`` one batch at a time). When each change travelled
as a row with JSON-encoded images, decoding JSON and folding dicts in Python on the driver was a
large share of a bulk batch's wall time, with the other core idle (bench/RESULTS.md "Streaming").
A block instead carries up to a few thousand changes of ONE table with their images already in the
table's canonical Arrow types (``core.types.arrow_schema``), built in the task; it crosses Spark as
one binary value (Arrow IPC) and the driver folds whole blocks with Arrow kernels.

:func:`fold_block` is the package's one "last change per key" fold: the stream folds a batch with
it, and :class:`~airflow_provider_mysqlcdc.spill.bucketed_fold.BucketedFold` calls it per hash
bucket for batches and snapshot binlog windows too large to fold at once.

A block's columns::

    op         'c' insert, 'u' update, 'd' delete (the handoff filter has already turned an update
               whose delete-half it dropped into an upsert: ``before`` null)
    file, pos  where the change's transaction starts (what the handoff filter compares)
    file_num, event_pos, row_index   the rows event and the row inside it (binlog order)
    seq        order inside the micro-batch (see ``stream/partition_read.py``)
    commit_ts  the rows event's timestamp, epoch seconds
    before     struct of the before image: the key columns only (all the sink needs), or every
               column (``before_image='full'``); null for inserts and filtered delete-halves
    after      struct of every column of the table; null for deletes

Pure logic: no I/O, no Spark; the tasks and the driver both import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core.row_metadata import change_metadata, lake_schema

META_FIELDS = [
    pa.field("op", pa.string(), nullable=False),
    pa.field("file", pa.string(), nullable=False),
    pa.field("pos", pa.int64(), nullable=False),
    pa.field("file_num", pa.int32(), nullable=False),
    pa.field("event_pos", pa.int64(), nullable=False),
    pa.field("row_index", pa.int32(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("commit_ts", pa.int64(), nullable=False),
]
_META_NAMES = [f.name for f in META_FIELDS]


def block_schema(table_schema: pa.Schema, key_columns: Sequence[str], full_before: bool = False) -> pa.Schema:
    """The schema of a block of one table whose canonical Arrow schema is ``table_schema``."""
    before_fields = list(table_schema) if full_before else [table_schema.field(c) for c in key_columns]
    return pa.schema([*META_FIELDS, pa.field("before", pa.struct(before_fields)),
                      pa.field("after", pa.struct(list(table_schema)))])  # fmt: skip


class BlockBuilder:
    """Collects the changes of one table in binlog order and turns them into an Arrow block.

    Images are canonical Python rows (``mysql.binlog_values.binlog_row_converter`` / the fast decoder);
    Arrow converts the lists of dicts column-wise in C++ (a dict key the struct does not name is
    ignored, so a full before image can feed a key-only ``before``).
    """

    __slots__ = (
        "after",
        "before",
        "commit_ts",
        "event_pos",
        "file",
        "file_num",
        "op",
        "pos",
        "row_index",
        "schema",
        "seq",
    )  # fmt: skip

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.op: list[str] = []
        self.file: list[str] = []
        self.pos: list[int] = []
        self.file_num: list[int] = []
        self.event_pos: list[int] = []
        self.row_index: list[int] = []
        self.seq: list[int] = []
        self.commit_ts: list[int] = []
        self.before: list[Mapping[str, Any] | None] = []
        self.after: list[Mapping[str, Any] | None] = []

    def __len__(self) -> int:
        return len(self.op)

    def add(
        self,
        op: str,
        file: str,
        pos: int,
        file_num: int,
        event_pos: int,
        row_index: int,
        seq: int,
        commit_ts: int,
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
    ) -> None:
        self.op.append(op)
        self.file.append(file)
        self.pos.append(pos)
        self.file_num.append(file_num)
        self.event_pos.append(event_pos)
        self.row_index.append(row_index)
        self.seq.append(seq)
        self.commit_ts.append(commit_ts)
        self.before.append(before)
        self.after.append(after)

    def extend(
        self,
        op: str,
        file: str,
        pos: int,
        file_num: int,
        event_pos: int,
        first_row: int,
        first_seq: int,
        commit_ts: int,
        befores: Sequence[Mapping[str, Any] | None],
        afters: Sequence[Mapping[str, Any] | None],
    ) -> None:
        """:meth:`add` for the rows of one rows event at once (rows ``first_row``, ``first_row + 1``, ...
        of the event, taking ``seq`` ``first_seq``, ``first_seq + 1``, ...)."""
        n = len(afters)
        self.op.extend([op] * n)
        self.file.extend([file] * n)
        self.pos.extend([pos] * n)
        self.file_num.extend([file_num] * n)
        self.event_pos.extend([event_pos] * n)
        self.row_index.extend(range(first_row, first_row + n))
        self.seq.extend(range(first_seq, first_seq + n))
        self.commit_ts.extend([commit_ts] * n)
        self.before.extend(befores)
        self.after.extend(afters)

    def build(self) -> pa.RecordBatch:
        """The collected changes as one record batch; the builder is empty afterwards (also when a
        value does not fit its column's type: ``pyarrow.ArrowInvalid``/``ArrowTypeError`` then)."""
        s = self.schema
        try:
            arrays = self._arrays(s)
        finally:
            for lst in (self.op, self.file, self.pos, self.file_num, self.event_pos, self.row_index, self.seq,
                        self.commit_ts, self.before, self.after):  # fmt: skip
                lst.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=s)

    def _arrays(self, s: pa.Schema) -> list[pa.Array]:
        return [
            pa.array(self.op, s.field("op").type),
            pa.array(self.file, s.field("file").type),
            pa.array(self.pos, s.field("pos").type),
            pa.array(self.file_num, s.field("file_num").type),
            pa.array(self.event_pos, s.field("event_pos").type),
            pa.array(self.row_index, s.field("row_index").type),
            pa.array(self.seq, s.field("seq").type),
            pa.array(self.commit_ts, s.field("commit_ts").type),
            pa.array(self.before, s.field("before").type),
            pa.array(self.after, s.field("after").type),
        ]


def encode_block(batch: pa.RecordBatch) -> bytes:
    """Arrow IPC stream bytes of one block (uncompressed: on 2 cores CPU is scarcer than bytes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_blocks(blobs: Iterable[bytes]) -> pa.Table | None:
    """The blocks of one table as one Arrow table in ``seq`` order; None when there are none."""
    tables = [pa.ipc.open_stream(pa.py_buffer(b)).read_all() for b in blobs]
    if not tables:
        return None
    data = pa.concat_tables(tables, promote_options="none") if len(tables) > 1 else tables[0]
    seq = np.concatenate([c.to_numpy() for c in data.column("seq").chunks]) if data.num_rows else None
    if seq is None or bool(np.all(seq[1:] > seq[:-1])):  # a task builds its blocks in seq order: no sort
        return data
    return data.sort_by("seq")


def changes_after(data: pa.Table, offset_key: tuple[int, int]) -> pa.Table:
    """The changes of ``data`` whose transaction starts after ``offset_key`` (a
    ``BinlogOffset.sort_key()``): what is left of a batch's changes once the table was emptied at
    that offset (a TRUNCATE; docs/architecture.md, "Schema changes")."""
    fnum, pos = offset_key
    later_file = pc.greater(data.column("file_num"), fnum)
    same_file = pc.and_(pc.equal(data.column("file_num"), fnum), pc.greater(data.column("pos"), pos))
    return data.filter(pc.or_(later_file, same_file))


def changes_before(data: pa.Table, offset_key: tuple[int, int]) -> pa.Table:
    """The changes of ``data`` whose transaction starts before ``offset_key``: the complement of
    :func:`changes_after` (what a table held when a TRUNCATE at that offset emptied it)."""
    fnum, pos = offset_key
    earlier_file = pc.less(data.column("file_num"), fnum)
    same_file = pc.and_(pc.equal(data.column("file_num"), fnum), pc.less(data.column("pos"), pos))
    return data.filter(pc.or_(earlier_file, same_file))


def changes_from(data: pa.Table, offset_key: tuple[int, int]) -> pa.Table:
    """The changes of ``data`` whose transaction starts at or after ``offset_key``: what a
    changelog complete up to that offset still lacks (``CapturedTable.changelog_from``)."""
    fnum, pos = offset_key
    later_file = pc.greater(data.column("file_num"), fnum)
    same_file = pc.and_(pc.equal(data.column("file_num"), fnum), pc.greater_equal(data.column("pos"), pos))
    return data.filter(pc.or_(later_file, same_file))


def fold_block(data: pa.Table, primary_key: Sequence[str], with_metadata: bool = False) -> tuple[pa.Table, pa.Table]:
    """Fold a table's changes (a decoded block table) into ``(upserts, delete_keys)``.

    The last change per key wins, an update that changes the key deletes the old key and upserts
    the new one, keys are compared by exact value (the readable reference,
    ``tests/support/reference_fold.py``, is checked against this by tests/unit/core/test_change_block.py).
    Vectorised: every change becomes one or two key events ``(key, seq, delete?)``; the events are
    sorted by key then ``seq`` and the last of each run of equal keys survives.

    ``upserts`` has the columns of the ``after`` struct (the table's Arrow schema), and with
    ``with_metadata`` the metadata columns of the change that won (``core/row_metadata.py``);
    ``delete_keys`` the primary-key columns, typed like the table's. Each key is in exactly one of them.
    """
    cols = list(primary_key)
    if not cols:
        raise ValueError("fold_block needs the primary key columns: a table without a key cannot be merged")
    after_type: pa.StructType = data.schema.field("after").type
    after_fields = [after_type.field(i) for i in range(after_type.num_fields)]
    key_fields = [after_type.field(c) for c in cols]
    n = data.num_rows
    up_schema = lake_schema(pa.schema(after_fields), with_metadata)
    if n == 0:
        return up_schema.empty_table(), pa.schema(key_fields).empty_table()

    op = data.column("op").combine_chunks()
    before = data.column("before").combine_chunks()
    after = data.column("after").combine_chunks()
    seq = data.column("seq").combine_chunks()
    if n <= FEW_CHANGES and not any(pa.types.is_floating(f.type) for f in key_fields):
        final_rows, delete_rows = _last_per_key(op, before, after, seq, cols)
        return _folded(data, after, before, final_rows, delete_rows, cols, after_fields, key_fields, up_schema,
                       with_metadata)  # fmt: skip
    bad_op = pc.invert(pc.is_in(op, pa.array(["c", "u", "d"])))
    if pc.any(bad_op).as_py():
        raise ValueError(f"change block holds unknown ops {pc.unique(pc.filter(op, bad_op)).to_pylist()}")
    has_before = before.is_valid()
    has_after = after.is_valid()
    is_delete = pc.equal(op, "d")
    if pc.any(pc.and_(is_delete, pc.invert(has_before))).as_py():
        raise ValueError("change block has a delete without a before image")
    if pc.any(pc.and_(pc.invert(is_delete), pc.invert(has_after))).as_py():
        raise ValueError("change block has an insert or update without an after image")

    after_keys = [pc.struct_field(after, c) for c in cols]
    before_keys = [pc.struct_field(before, c) for c in cols]
    # A delete event for every delete, and for every update whose key changed (old key removed).
    key_changed = keys_differ(before_keys, after_keys)
    del_mask = pc.or_(is_delete, pc.and_(has_before, pc.fill_null(key_changed, False)))
    up_mask = has_after
    index = pa.array(range(n), pa.int64())

    ups = pa.table([*(pc.filter(k, up_mask) for k in after_keys), pc.filter(seq, up_mask),
                    pc.filter(index, up_mask)], names=[*cols, "__seq", "__row"])  # fmt: skip
    dels = pa.table([*(pc.filter(k, del_mask) for k in before_keys), pc.filter(seq, del_mask),
                     pa.nulls(pc.sum(del_mask).as_py() or 0, pa.int64())], names=[*cols, "__seq", "__row"])  # fmt: skip
    ups = ups.cast(pa.schema([*key_fields, pa.field("__seq", pa.int64()), pa.field("__row", pa.int64())]))
    dels = dels.cast(ups.schema)
    events = pa.concat_tables([ups, dels])
    # Last event per key: sort by key, then seq; a row survives if the next row has another key.
    order = pc.sort_indices(events, sort_keys=[*((c, "ascending") for c in cols), ("__seq", "ascending")])
    events = events.take(order).combine_chunks()
    keys = [events.column(c).chunk(0) for c in cols]
    # the last row of the table, and every row whose successor has another key
    last = pa.concat_arrays([keys_differ([k[:-1] for k in keys], [k[1:] for k in keys]), pa.array([True])])
    final = events.filter(last)
    rows = final.column("__row")
    is_up = rows.is_valid()
    up_rows = pc.filter(rows, is_up)
    delete_keys = final.filter(pc.invert(is_up)).select(cols).cast(pa.schema(key_fields))
    return _folded(data, after, None, up_rows, delete_keys, cols, after_fields, key_fields, up_schema, with_metadata)


#: Up to this many changes, a table's fold is a dict over its keys instead of ~40 Arrow kernel calls,
#: whose fixed cost dominates there: a micro-batch over hundreds of tables gives each a few changes.
FEW_CHANGES = 64


def _last_per_key(op: pa.Array, before: pa.Array, after: pa.Array, seq: pa.Array,
                  cols: list[str]) -> tuple[pa.Array, pa.Array]:  # fmt: skip
    """The few-changes fold: ``(rows whose after image wins, rows whose before key is deleted)``.

    The same events as the vectorised path (an upsert of every after image, a delete of every
    delete's and every key-moving update's before key; the highest ``seq`` per key wins), the same
    checks in the same order. Keys compare as Python values: exact for every key type but floating
    point (NaN, -0.0), which keeps the vectorised path."""
    ops = op.to_pylist()
    bad = sorted({o for o in ops if o not in ("c", "u", "d")}, key=str)
    if bad:
        raise ValueError(f"change block holds unknown ops {bad}")
    has_before, has_after = before.is_valid().to_pylist(), after.is_valid().to_pylist()
    if any(o == "d" and not b for o, b in zip(ops, has_before, strict=True)):
        raise ValueError("change block has a delete without a before image")
    if any(o != "d" and not a for o, a in zip(ops, has_after, strict=True)):
        raise ValueError("change block has an insert or update without an after image")
    before_keys = list(zip(*(pc.struct_field(before, c).to_pylist() for c in cols), strict=True))
    after_keys = list(zip(*(pc.struct_field(after, c).to_pylist() for c in cols), strict=True))
    last: dict[tuple[Any, ...], tuple[int, int, bool]] = {}  # key -> (seq, row, upsert?)
    for i, (o, s) in enumerate(zip(ops, seq.to_pylist(), strict=True)):
        events = []
        if has_before[i] and (o == "d" or not has_after[i] or before_keys[i] != after_keys[i]):
            events.append((before_keys[i], False))
        if has_after[i]:
            events.append((after_keys[i], True))
        for key, upsert in events:
            held = last.get(key)
            if held is None or s > held[0]:
                last[key] = (s, i, upsert)
    ups = [i for _, i, u in last.values() if u]
    dels = [i for _, i, u in last.values() if not u]
    return pa.array(ups, pa.int64()), pa.array(dels, pa.int64())


def _folded(data: pa.Table, after: pa.Array, before: pa.Array | None, up_rows: pa.Array, deletes: Any,
            cols: list[str], after_fields: list[pa.Field], key_fields: list[pa.Field], up_schema: pa.Schema,
            with_metadata: bool) -> tuple[pa.Table, pa.Table]:  # fmt: skip
    """``(upserts, delete_keys)`` from the winning rows: ``deletes`` is the delete-key table, or (with
    ``before``) the rows whose before image's key is deleted."""
    if not len(up_rows):
        upserts = up_schema.empty_table()
    else:
        upserts = pa.Table.from_struct_array(after.take(up_rows)).cast(pa.schema(after_fields))
        if with_metadata:
            meta = change_metadata(*(data.column(c).combine_chunks().take(up_rows)
                                     for c in ("op", "commit_ts", "file", "pos")))  # fmt: skip
            upserts = pa.Table.from_arrays([*upserts.columns, *meta], schema=up_schema)
    if before is not None:
        picked = before.take(deletes)
        deletes = pa.table([pc.struct_field(picked, c) for c in cols], names=cols).cast(pa.schema(key_fields))
    return upserts, deletes


def keys_differ(left: Sequence[Any], right: Sequence[Any]) -> Any:
    """Element-wise: does any column pair differ? The fold's and the SCD2 view's key comparison. Nulls
    compare as different from values only where one side is null (key columns are NOT NULL, so this
    only happens for absent images)."""
    out = None
    for a, b in zip(left, right, strict=True):
        ne = pc.not_equal(a, b)
        # null on exactly one side = different; null on both = same (absent image on both sides)
        one_null = pc.xor(pc.is_null(a), pc.is_null(b))
        ne = pc.or_kleene(pc.fill_null(ne, False), one_null)
        out = ne if out is None else pc.or_(out, ne)
    assert out is not None
    return out


def block_changes(data: pa.Table) -> list[dict[str, Any]]:
    """A block table as plain per-change dicts (tests, debugging); images as dicts or None."""
    return data.select([*_META_NAMES, "before", "after"]).to_pylist()


__all__ = [
    "FEW_CHANGES",
    "META_FIELDS",
    "BlockBuilder",
    "block_changes",
    "block_schema",
    "decode_blocks",
    "encode_block",
    "fold_block",
    "keys_differ",
]  # fmt: skip
