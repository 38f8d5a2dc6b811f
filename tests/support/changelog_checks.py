"""The checks of a changelog against its source: its binlog changes against an independent binlog
read, its SCD2 view's current rows and the mirror against the source, the mirror's metadata
columns against the current versions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core.change import RowChange
from airflow_provider_mysqlcdc.core.handoff import HandoffFilter, admit
from airflow_provider_mysqlcdc.core.table import TableSchema
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import read_scd2
from tests.support.verify import compare

#: a row image (a dict, or None) -> the comparable tuple the check compares
Image = Callable[[dict[str, Any] | None], tuple[Any, ...] | None]


def assert_changes_are_the_binlog_s(
    table: str, changes: pa.Table, independent: Sequence[RowChange], flt: HandoffFilter, key_columns: list[str],
    image: Image,
) -> None:  # fmt: skip
    """``changes`` (a changelog's binlog rows, in binlog order) are exactly the ``independent`` changes
    of ``table`` the handoff rule ``flt`` admits, in order, each once, with their ops and images."""
    expected = []
    for ch in independent:
        kept = admit(ch, flt, key_columns) if ch.table == table else None
        if kept is not None:
            expected.append((kept.op, kept.tx_offset.file, kept.tx_offset.pos, image(kept.before), image(kept.after)))
    rows = changes.to_pylist()
    got = [(r["_op"], r["_binlog_file"], r["_binlog_pos"], image(r["before"]), image(r["after"])) for r in rows]
    first = next(((i, g, e) for i, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e), None)
    assert got == expected, (table, len(got), len(expected), first)
    ids = [(r["_tx_id"], r["_event_pos"], r["_row_index"]) for r in rows]
    assert len(set(ids)) == len(ids), f"{table}: a change is in the changelog twice"
    assert len(expected) > 50, f"{table}: the writer made too few changes to prove anything ({len(expected)})"


def assert_history_is_the_source(conn: Any, sink: DeltaSink, table: str, schema: TableSchema,
                                 merge_key: list[str]) -> pa.Table:  # fmt: skip
    """The SCD2 view's current rows and the mirror equal the source row for row, and every mirror
    row's metadata columns are those of its current version; returns the mirror."""
    hist = read_scd2(sink, table, merge_key)
    current = hist.filter(hist.column("is_current")).select([c.name for c in schema.columns])
    cmp = compare(conn, schema, current)
    assert cmp.match, f"{table} SCD2 current rows: {cmp.first_difference}"
    mirror = sink.read(table)
    cmp = compare(conn, schema, mirror)
    assert cmp.match, f"{table} mirror: {cmp.first_difference}"
    meta = ["_op", "_binlog_file", "_binlog_pos"]
    lake_meta = sorted(tuple(r.values()) for r in mirror.select([*merge_key, *meta, "_commit_ts"]).to_pylist())
    scd_meta = sorted(tuple(r.values()) for r in hist.filter(hist.column("is_current"))
                      .select([*merge_key, *meta, "valid_from"]).to_pylist())  # fmt: skip
    assert lake_meta == scd_meta, next((a, b) for a, b in zip(lake_meta, scd_meta, strict=False) if a != b)
    return mirror
