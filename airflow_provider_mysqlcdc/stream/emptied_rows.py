"""The rows a followed TRUNCATE or DROP (policy ``evolve``) removed, for the table's changelog.

Why: the binlog logs such a statement without a row event, so the changelog — and the SCD2 view
derived from it — would keep every removed row current. The rows the table held at each emptying
DDL of a batch are the Delta table before the batch plus the batch's changes up to that DDL; each
becomes an op ``d`` changelog row at the DDL's offset (core/changelog.removed_to_changelog),
appended in the batch's one changelog commit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from airflow_provider_mysqlcdc.core.change_block import changes_after, changes_before, fold_block
from airflow_provider_mysqlcdc.core.changelog import removed_to_changelog
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.spill.changed_keys import member_mask


def removed_rows_changelog(
    sink: DeltaSink,
    table: str,
    schema: pa.Schema,
    primary_key: Sequence[str],
    blocks: list[pa.Table],
    points: Sequence[tuple[BinlogOffset, int]],
    since: BinlogOffset | None = None,
) -> list[pa.Table]:
    """Changelog rows for what each emptying DDL at ``points`` ((offset, commit time in seconds), in
    any order) removed; ``blocks`` are the table's decoded change blocks of the batch. A DDL before
    ``since`` (the table's ``changelog_from``) still empties the state but is logged already."""
    key = list(primary_key)
    key_schema = pa.schema([schema.field(c) for c in key])
    state = sink.read(table).select(schema.names).cast(schema)  # as the batch found it
    out = []
    prev: BinlogOffset | None = None
    for at, commit_ts in sorted(points):
        seg = [changes_before(b, at.sort_key()) for b in blocks]
        if prev is not None:
            seg = [changes_after(b, prev.sort_key()) for b in seg]
        seg = [b for b in seg if b.num_rows]
        if seg:
            upserts, deletes = fold_block(pa.concat_tables(seg).sort_by("seq"), key)
            changed = pa.concat_tables([upserts.select(key).cast(key_schema), deletes.select(key).cast(key_schema)])
            keep = ~member_mask(state.select(key), changed, key) if state.num_rows else np.zeros(0, dtype=bool)
            state = pa.concat_tables([state.filter(pa.array(keep)), upserts.select(schema.names).cast(schema)])
        if since is None or not at < since:
            out.append(removed_to_changelog(state, schema, at, commit_ts))
        state, prev = schema.empty_table(), at
    return out


__all__ = ["removed_rows_changelog"]
