"""Which way a stream batch goes into a Delta table other than a MERGE: one decision, in one place.

Why: a small table is rewritten whole from the rows the stream carries
(:mod:`~airflow_provider_mysqlcdc.sinks.delta_small_table`), a bigger one with one integer key takes
deletion vectors (:mod:`~airflow_provider_mysqlcdc.sinks.delta_dv_table`), and the rest keep the
MERGE. A table that already carries a deletion-vector state stays on that path whatever its size.
"""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_table import apply_big_table
from airflow_provider_mysqlcdc.sinks.delta_small_table import rewrite_small_table


def apply_without_merge(sink: DeltaSink, table: str, upserts: pa.Table, deletes: pa.Table, primary_key: list[str],
                        app_id: str, version: int) -> bool | None:  # fmt: skip
    """Apply the batch by the small-table rewrite or by deletion vectors, as :class:`DeltaSink`'s
    settings and the table's size say; None when it takes the MERGE."""
    uri = sink.table_uri(table)
    big = sink.table_states.get_big(uri)
    if big is not None:
        return apply_big_table(sink, table, upserts, deletes, primary_key, app_id, version, big)
    if sink.rewrite_below_bytes:
        key = sink.state_key(table)
        state = sink.table_states.get(key)
        dt = None if state is not None else sink.latest(table)
        size = state.live_size if state is not None else sum(sink.table_files(table, dt).values())
        if size <= sink.rewrite_below_bytes:
            return rewrite_small_table(sink, table, upserts, deletes, primary_key, app_id, version, opened=dt)
        sink.table_states.forget_key(key)  # grown past it: the other paths read the table themselves
    if sink.deletion_vectors and uri not in sink.dv_blocked:
        return apply_big_table(sink, table, upserts, deletes, primary_key, app_id, version, None)  # None: blocked
    return None


__all__ = ["apply_without_merge"]
