"""Changelog rows and the SCD type 2 view derived from them (docs/architecture.md, "Changelog").

Why a changelog beside the mirror: the mirror table holds the current state only; a changelog
table holds every change the stream applied — and every snapshot row, as op ``r`` at its group's
high watermark — so history and "what changed since" questions need no second pipeline. Rows
come from the same change blocks the mirror's fold reads, so the two never disagree about which
changes the handoff rule let through.

A changelog row::

    _op          'c' insert, 'u' update, 'd' delete, 'r' snapshot read (a first snapshot, a
                 re-snapshot or a repair: every row read, as of its group's HW)
    _commit_ts   the change's binlog event time (a snapshot row: when its group's HW was taken), UTC
    _tx_id       the transaction: '<file>:<pos>' where it starts in the binlog ('snapshot:<plan>:<group>'
                 for snapshot rows; 'snapshot:<plan>:removed' for a 'd' of a row a re-read found
                 gone from the source though no binlog event removed it)
    _binlog_file, _binlog_pos   where the change's transaction starts (a snapshot row: its HW)
    _event_pos   the rows event in that file (a snapshot row: the HW's position)
    _row_index   the row inside the rows event (a snapshot row: 0)
    before       every column before the change (null for 'c' and 'r', and for an update whose
                 delete-half the handoff rule dropped)
    after        every column after the change (null for 'd')

Binlog order is ``(file number, _event_pos, _row_index)``: :func:`order_key` computes it.

Pure logic: Arrow only, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core.change_block import changes_from, keys_differ
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.row_metadata import TIMESTAMP

META_FIELDS = [
    pa.field("_op", pa.string(), nullable=False),
    pa.field("_commit_ts", TIMESTAMP),
    pa.field("_tx_id", pa.string(), nullable=False),
    pa.field("_binlog_file", pa.string(), nullable=False),
    pa.field("_binlog_pos", pa.int64(), nullable=False),
    pa.field("_event_pos", pa.int64(), nullable=False),
    pa.field("_row_index", pa.int32(), nullable=False),
]
SCD2_FIELDS = [
    pa.field("valid_from", TIMESTAMP),
    pa.field("valid_to", TIMESTAMP),
    pa.field("is_current", pa.bool_(), nullable=False),
]


def changelog_schema(table_schema: pa.Schema) -> pa.Schema:
    """The changelog table's schema for a source table whose canonical Arrow schema is ``table_schema``."""
    image = pa.struct(list(table_schema))
    return pa.schema([*META_FIELDS, pa.field("before", image), pa.field("after", image)])


def changes_to_changelog(block: pa.Table, table_schema: pa.Schema, since: BinlogOffset | None = None) -> pa.Table:
    """A decoded change block table (``core/change_block.py``) as changelog rows, in its order.

    The block's ``before`` carries every column when the stream decodes full before images (it does
    for a table with a changelog); a key-only image is widened with nulls so every row has one type.
    ``since`` (the table's ``changelog_from``) leaves out changes of transactions starting before
    it: the changelog has them already, and a generation replaying them must not log them twice.
    """
    if since is not None:
        block = changes_from(block, since.sort_key())
    schema = changelog_schema(table_schema)
    image = schema.field("after").type
    file = block.column("file")
    pos = block.column("pos")
    tx_id = pc.binary_join_element_wise(file, pc.cast(pos, pa.string()), ":")
    cols = [
        block.column("op"),
        pc.cast(pc.multiply(block.column("commit_ts"), 1_000_000), pa.int64()).cast(TIMESTAMP),
        tx_id,
        file,
        pos,
        block.column("event_pos"),
        block.column("row_index"),
        _widen(block.column("before"), image),
        _widen(block.column("after"), image),
    ]
    return pa.Table.from_arrays(cols, schema=schema)


def snapshot_to_changelog(
    rows: pa.Table, table_schema: pa.Schema, high_watermark: BinlogOffset, taken_at: float, tx_id: str
) -> pa.Table:
    """A snapshot group's rows of one table (already at its HW) as op ``r`` changelog rows."""
    return _rows_at("r", rows, table_schema, high_watermark, taken_at, tx_id)


def removed_to_changelog(
    rows: pa.Table, table_schema: pa.Schema, at: BinlogOffset, commit_ts: float, tx_id: str | None = None
) -> pa.Table:
    """Rows removed without a row event, as op ``d`` changelog rows at ``at``: those a TRUNCATE (or
    DROP) at ``at`` removed (``tx_id`` its transaction), or those a re-read found gone at its
    high watermark ``at`` (``tx_id`` :func:`reread_removed_tx`). Without them the SCD2 view would
    keep the rows current."""
    return _rows_at("d", rows, table_schema, at, commit_ts, tx_id or f"{at.file}:{at.pos}")


def reread_removed_tx(plan_id: str) -> str:
    """The ``_tx_id`` of the rows a re-read (re-snapshot, repair) of plan ``plan_id`` found gone
    from the source: beside its groups' ``snapshot:<plan>:<group>`` rows."""
    return f"snapshot:{plan_id}:removed"


def _rows_at(op: str, rows: pa.Table, table_schema: pa.Schema, at: BinlogOffset, ts: float, tx_id: str) -> pa.Table:
    """Whole rows as changelog rows of one op at one binlog offset: ``r`` rows as their after image
    (all at row index 0, as a snapshot row has no rows event), ``d`` rows as their before image."""
    schema = changelog_schema(table_schema)
    n = rows.num_rows
    rows = rows.select(table_schema.names).cast(table_schema)
    empty = pa.nulls(n, schema.field("after").type)
    children = [rows.column(c).combine_chunks() for c in table_schema.names]
    image = pa.StructArray.from_arrays(children, fields=list(table_schema)) if n else empty
    cols = [
        pa.array([op] * n, pa.string()),
        pa.array([int(ts * 1_000_000)] * n, pa.int64()).cast(TIMESTAMP),
        pa.array([tx_id] * n, pa.string()),
        pa.array([at.file] * n, pa.string()),
        pa.array([at.pos] * n, pa.int64()),
        pa.array([at.pos] * n, pa.int64()),
        pa.array(range(n) if op == "d" else [0] * n, pa.int32()),
        image if op == "d" else empty,
        empty if op == "d" else image,
    ]
    return pa.Table.from_arrays(cols, schema=schema)


def order_key(changelog: pa.Table) -> pa.Table:
    """``changelog`` with ``_file_num`` added and sorted in binlog order (snapshot rows sort before
    the changes of the transaction starting at their HW: a change's event lies after its start)."""
    suffix = pc.extract_regex(changelog.column("_binlog_file"), r"\.(?P<n>[0-9]+)$")
    nums = pc.cast(pc.struct_field(suffix, "n"), pa.int64())
    snap_first = pc.if_else(pc.equal(changelog.column("_op"), "r"), 0, 1)
    t = changelog.append_column("_file_num", nums).append_column("__snap_last", snap_first)
    t = t.sort_by([("_file_num", "ascending"), ("_event_pos", "ascending"), ("__snap_last", "ascending"),
                   ("_row_index", "ascending")])  # fmt: skip
    return t.drop_columns(["__snap_last"])


def scd2(changelog: pa.Table, key: Sequence[str]) -> pa.Table:
    """The SCD type 2 history of one table from its changelog: one row per version of a key.

    A version starts at a change with an after image (``c``, ``u``, ``r``) and ends at the next
    event of the same key: a later version, a delete, or an update that moved the row to another
    key. ``valid_to`` is null and ``is_current`` true for the versions still in the source.
    Columns: the table's columns, ``valid_from``, ``valid_to``, ``is_current``, ``_op``, ``_tx_id``,
    ``_binlog_file``, ``_binlog_pos`` of the change that started the version.
    """
    image: pa.StructType = changelog.schema.field("after").type
    fields = [image.field(i) for i in range(image.num_fields)]
    out_schema = pa.schema([*fields, *SCD2_FIELDS, *(f for f in META_FIELDS if f.name in
                                                     ("_op", "_tx_id", "_binlog_file", "_binlog_pos"))])  # fmt: skip
    if changelog.num_rows == 0:
        return out_schema.empty_table()
    t = order_key(changelog).combine_chunks()
    n = t.num_rows
    before, after = t.column("before").chunk(0), t.column("after").chunk(0)
    seq = pa.array(range(n), pa.int64())
    has_after = after.is_valid()
    after_keys = [pc.struct_field(after, c) for c in key]
    before_keys = [pc.struct_field(before, c) for c in key]
    # a key's events: every version start (after key) and every end without a new version there
    # (a delete, or the old key of a key-moving update)
    moved = pc.fill_null(keys_differ(before_keys, after_keys), False)
    ends = pc.and_(before.is_valid(), pc.or_(pc.invert(has_after), moved))
    starts = pa.table([*(pc.filter(k, has_after) for k in after_keys), pc.filter(seq, has_after),
                       pc.filter(seq, has_after)], names=[*key, "__seq", "__row"])  # fmt: skip
    stops = pa.table([*(pc.filter(k, ends) for k in before_keys), pc.filter(seq, ends),
                      pa.nulls(pc.sum(ends).as_py() or 0, pa.int64())], names=[*key, "__seq", "__row"])  # fmt: skip
    events = pa.concat_tables([starts, stops.cast(starts.schema)])
    events = events.sort_by([*((c, "ascending") for c in key), ("__seq", "ascending")]).combine_chunks()
    keys = [events.column(c).chunk(0) for c in key]
    same_next = pc.invert(pa.concat_arrays([keys_differ([k[1:] for k in keys], [k[:-1] for k in keys]),
                                            pa.array([True])]))  # fmt: skip
    next_seq = pa.concat_arrays([events.column("__seq").chunk(0)[1:], pa.nulls(1, pa.int64())])
    next_seq = pc.if_else(same_next, next_seq, pa.nulls(len(next_seq), pa.int64()))
    versions = events.append_column("__next", next_seq).filter(events.column("__row").is_valid())
    rows = versions.column("__row").combine_chunks()
    ts = t.column("_commit_ts").chunk(0)
    nxt = versions.column("__next").combine_chunks()
    valid_to = pc.take(ts, pc.fill_null(nxt, 0))
    valid_to = pc.if_else(nxt.is_valid(), valid_to, pa.nulls(len(nxt), TIMESTAMP))
    images = pa.Table.from_struct_array(pc.take(after, rows))
    cols = [images.column(f.name) for f in fields] + [
        pc.take(ts, rows), valid_to, pc.invert(nxt.is_valid()),
        pc.take(t.column("_op").chunk(0), rows), pc.take(t.column("_tx_id").chunk(0), rows),
        pc.take(t.column("_binlog_file").chunk(0), rows), pc.take(t.column("_binlog_pos").chunk(0), rows),
    ]  # fmt: skip
    return pa.Table.from_arrays(cols, schema=out_schema)


def _widen(images: pa.ChunkedArray | pa.Array, image: pa.StructType) -> pa.Array:
    """Struct images as ``image`` (the table's full row): missing fields null, same validity."""
    arr = images.combine_chunks() if isinstance(images, pa.ChunkedArray) else images
    have = {arr.type.field(i).name for i in range(arr.type.num_fields)}
    children = []
    for i in range(image.num_fields):
        f = image.field(i)
        child = pc.struct_field(arr, f.name) if f.name in have else pa.nulls(len(arr), f.type)
        children.append(child.cast(f.type))
    mask = pc.invert(arr.is_valid())
    return pa.StructArray.from_arrays(children, fields=[image.field(i) for i in range(image.num_fields)], mask=mask)


__all__ = ["META_FIELDS", "SCD2_FIELDS", "changelog_schema", "changes_to_changelog", "order_key",
           "removed_to_changelog", "reread_removed_tx", "scd2", "snapshot_to_changelog"]  # fmt: skip
