"""Apply a stream batch to a SMALL Delta table by rewriting the whole table as one file, once.

Why: a database of hundreds of small tables gets a batch touching most of them; a delta-rs MERGE
plans a DataFusion query per call, which is most of a small table's apply time, and a file-by-file
rewrite leaves one more file per batch to match next time. A table of a few MiB is read whole,
the batch's changed keys dropped, its upserts added, and written back as ONE sorted file in one
commit that removes every file it read — the same result as the MERGE, the same Delta transaction
``(app_id, version)`` (a replay is skipped), and a table that stays one file however many batches
it takes (docs/architecture.md, "Applying a batch's tables at once"). Bigger tables keep the MERGE
(:mod:`~airflow_provider_mysqlcdc.sinks.delta_merge`).

The stream carries each table's state from batch to batch
(:mod:`~airflow_provider_mysqlcdc.sinks.delta_table_state`) and commits by writing the next log
entry itself (:mod:`~airflow_provider_mysqlcdc.sinks.delta_log`): no log reload, no transaction
lookup and no file read per batch while it is the only writer. A routed shard (its partition of a
shared table, written by other shards' threads in the same batch) and a table whose protocol or
storage the direct commit does not serve go through delta-rs' transaction instead.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_purge import purge_deletion_vectors
from airflow_provider_mysqlcdc.sinks.delta_files import remove_action
from airflow_provider_mysqlcdc.sinks.delta_log import (
    LogConflict,
    add_entry,
    checkpoint_due,
    commit_actions,
    log_writable,
    remove_entry,
    unsupported_reason,
)
from airflow_provider_mysqlcdc.sinks.delta_merge import (
    COMMIT_ATTEMPTS,
    already_applied,
    conform_upserts,
    delta_arrow_schema,
)
from airflow_provider_mysqlcdc.sinks.delta_rewrite import _added, _conform, _FileWriter, _NewFile, _TableFiles
from airflow_provider_mysqlcdc.sinks.delta_routing import file_schema
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns, file_stats
from airflow_provider_mysqlcdc.sinks.delta_table_state import TableState
from airflow_provider_mysqlcdc.spill.changed_keys import member_mask

log = logging.getLogger(__name__)


def rewrite_small_table(
    sink: DeltaSink,
    table: str,
    upserts: pa.Table,
    deletes: pa.Table,
    primary_key: list[str],
    app_id: str,
    version: int,
    opened: DeltaTable | None = None,
) -> bool:
    """Make ``table`` (its shard, if routed) its rows minus the changed keys plus ``upserts``, as one
    file in one commit tagged ``(app_id, version)``; False if the table already records ``version``.

    ``upserts``/``deletes`` are a folded batch (each key once), as for :meth:`DeltaSink.apply_changes`.
    ``opened``: the table at its latest version, if the caller has it.
    """
    if sink.route_of(table) is None and log_writable(sink.storage, sink.table_uri(table)):
        return _rewrite_by_log(sink, table, upserts, deletes, list(primary_key), app_id, version, opened)
    return _rewrite_by_delta_rs(sink, table, upserts, deletes, list(primary_key), app_id, version, opened)


def _remaining_rows(current: pa.Table, schema: pa.Schema, table: str, upserts: pa.Table, deletes: pa.Table,
                    key: list[str], fill_absent: bool) -> pa.Table:  # fmt: skip
    """``current`` without the batch's changed keys, plus its upserts, sorted by key."""
    key_schema = pa.schema([schema.field(c) for c in key])
    changed = pa.concat_tables([upserts.select(key).cast(key_schema), deletes.select(key).cast(key_schema)])
    drop = member_mask(current.select(key), changed, key) if current.num_rows else np.zeros(0, dtype=bool)
    rows = pa.concat_tables([current.filter(pa.array(~drop)), conform_upserts(table, schema, upserts, fill_absent)])
    return rows.sort_by([(c, "ascending") for c in key])


def _rewrite_by_log(sink: DeltaSink, table: str, upserts: pa.Table, deletes: pa.Table, key: list[str],
                    app_id: str, version: int, opened: DeltaTable | None) -> bool:  # fmt: skip
    """The rewrite from the carried state, committed by writing the log entry (module doc)."""
    uri = sink.table_uri(table)
    states = sink.table_states
    dt = opened
    for attempt in range(COMMIT_ATTEMPTS):
        state = states.get(uri)
        if state is None or app_id not in state.transactions:
            dt = dt if dt is not None else sink.latest(table)
            sink.check_owner(table, dt)
            state = TableState.of(uri, dt, unsupported_reason(dt), app_id)
            states.put(state)
        if state.log_blocker is not None:
            log.debug("%s: committed through delta-rs (its %s asks more of a writer than a direct log entry)",
                     table, state.log_blocker)  # fmt: skip
            states.forget(uri)
            return _rewrite_by_delta_rs(sink, table, upserts, deletes, key, app_id, version, dt)
        done = state.recorded(app_id, None)
        if done is not None and done >= version:
            log.info("%s: batch %s/%s already applied (table records %s); skipped", table, app_id, version, done)
            return False
        files = _TableFiles.of(sink, table, None)
        current = state.rows if state.rows is not None else _read_rows(files, state)
        rows = _remaining_rows(current, state.schema, table, upserts, deletes, key, fill_absent=False)
        columns = declared_stats_columns(state.configuration)
        written = [_write_rows(files, f"{files.stream_dir}/b{version:010d}-{uuid.uuid4().hex[:12]}-table.parquet",
                               rows, key, columns)] if rows.num_rows else []  # fmt: skip
        now = int(time.time() * 1000)
        actions = [*(remove_entry(rel, size, {}, now) for rel, size in state.files.items()),
                   *(add_entry(f.rel, f.size, {}, now, file_stats(f.rows, f.ranges, columns)) for f in written)]
        details = {"app_id": app_id, "version": version, "upserts": upserts.num_rows, "deletes": deletes.num_rows,
                   "small_table_rewrite": True}  # fmt: skip
        try:
            committed = commit_actions(sink.storage, uri, state.version, actions, app_transaction=(app_id, version),
                                       metadata={"mysqlcdc": json.dumps(details)})  # fmt: skip
        except LogConflict:
            log.info("%s: version %s was committed by another writer since this stream's last commit; reading the "
                     "table again for batch %s/%s", table, state.version + 1, app_id, version)  # fmt: skip
            states.forget(uri)
            dt = None
            time.sleep(min(0.01 * attempt, 1.0))
            continue
        states.committed(state, committed, {f.rel: f.size for f in written}, rows, (app_id, version))
        log.debug("%s: batch %s/%s rewrote %d file(s) into %d (%d rows; %d upserts, %d deletes) as version %s",
                  table, app_id, version, len(actions) - len(written), len(written), rows.num_rows,
                  upserts.num_rows, deletes.num_rows, committed)  # fmt: skip
        if checkpoint_due(committed, state.configuration):
            _checkpoint(sink, table)
        return True
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts found a newer version "
        "committed by another writer; is another job writing this table?"
    )


def _write_rows(files: _TableFiles, rel: str, rows: pa.Table, key: list[str], columns: list[str] | None) -> _NewFile:
    """``rows`` (sorted by ``key``) as one data file, with the value ranges of the statistics
    ``columns``: the first key column's are its first and last values."""
    buf = pa.BufferOutputStream()
    pq.write_table(rows, buf, use_dictionary=False, compression="snappy")
    data = buf.getvalue()
    files.write_bytes(rel, data)
    ranges: dict[str, tuple[Any, Any, int]] = {}
    for c in columns or []:
        if c not in rows.column_names:
            continue
        col = rows.column(c)
        if c == key[0] and not col.null_count:
            ranges[c] = (col[0].as_py(), col[-1].as_py(), 0)
        else:
            mm = pc.min_max(col)
            ranges[c] = (mm["min"].as_py(), mm["max"].as_py(), col.null_count)
    return _NewFile(rel, rows.num_rows, data.size, ranges)


def prime_table_state(sink: DeltaSink, table: str, dt: DeltaTable, app_id: str) -> bool:
    """Carry ``table``'s state, rows included, from the stream's start (``dt``: the table, just
    loaded) when its batches will take the direct rewrite; True if it does. The first batch over
    hundreds of tables then reads no log, asks no batch id and reads no file, as every later one."""
    uri = sink.table_uri(table)
    if not sink.rewrite_below_bytes or sink.route_of(table) or not log_writable(sink.storage, uri):
        return False
    if unsupported_reason(dt) is not None:
        return False
    state = TableState.of(uri, dt, None, app_id)
    if state.size > sink.rewrite_below_bytes:
        return False
    state.rows = _read_rows(_TableFiles.of(sink, table, None), state)
    sink.table_states.put(state)
    return True


def _read_rows(files: _TableFiles, state: TableState) -> pa.Table:
    """The table's rows, read from the files ``state`` lists, in its schema."""
    parts = [_conform(files.reader(rel).read(), state.schema) for rel in state.files]
    return pa.concat_tables(parts) if parts else state.schema.empty_table()


def _checkpoint(sink: DeltaSink, table: str) -> None:
    """The checkpoint (and expired log cleanup) delta-rs' own commit would have made here."""
    dt = sink.latest(table)
    dt.create_checkpoint()
    dt.cleanup_metadata()
    log.debug("%s: checkpoint at version %s", table, dt.version())


def _rewrite_by_delta_rs(sink: DeltaSink, table: str, upserts: pa.Table, deletes: pa.Table, key: list[str],
                         app_id: str, version: int, opened: DeltaTable | None) -> bool:  # fmt: skip
    """The rewrite read from the table and committed by delta-rs' transaction (module doc)."""
    route = sink.route_of(table)
    if route:
        app_id = route.app_id(app_id)
    dt = opened
    for attempt in range(COMMIT_ATTEMPTS):
        if dt is None:
            dt = sink.open(table)
        sink.check_owner(table, dt)
        if purge_deletion_vectors(sink, table, dt):  # the rewrite reads files as Parquet and removes them by path
            dt = sink.open(table)
        if already_applied(dt, table, app_id, version):
            return False
        full = delta_arrow_schema(dt)
        schema = file_schema(full) if route else full
        have = sink.table_files(table, dt)
        files = _TableFiles.of(sink, table, route)
        parts = [_conform(files.reader(rel).read(), schema) for rel in have]
        current = pa.concat_tables(parts) if parts else schema.empty_table()
        rows = _remaining_rows(current, schema, table, upserts, deletes, key, fill_absent=route is not None)
        out = _FileWriter(files, files.stream_dir, f"b{version:010d}-{uuid.uuid4().hex[:12]}-table", schema,
                          dt.metadata().configuration)  # fmt: skip
        if rows.num_rows:
            out.write(rows)
        out.close()
        now = int(time.time() * 1000)
        actions = [*(remove_action(rel, size, now) for rel, size in have.items()), *_added(out.written, route, now, dt)]
        commit = CommitProperties(
            app_transactions=[Transaction(app_id, version)],
            custom_metadata={"mysqlcdc": json.dumps({"app_id": app_id, "version": version, "upserts": upserts.num_rows,
                                                     "deletes": deletes.num_rows, "small_table_rewrite": True})},
        )  # fmt: skip
        try:
            dt.create_write_transaction(actions, mode="append", schema=full, commit_properties=commit,
                                        partition_by=list(SOURCE_COLUMNS) if route else None)  # fmt: skip
        except CommitFailedError as exc:  # a concurrent commit (a snapshot group): read the table again
            log.info("%s: batch %s/%s conflicted with a concurrent commit (%s); retrying",
                     table, app_id, version, str(exc).splitlines()[0])  # fmt: skip
            dt = None
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        log.debug("%s: batch %s/%s rewrote %d file(s) into %d (%d rows; %d upserts, %d deletes)", table, app_id,
                  version, len(have), len(out.written), rows.num_rows, upserts.num_rows, deletes.num_rows)  # fmt: skip
        return True
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts conflicted with "
        "concurrent commits; is another job writing this table?"
    )


__all__ = ["prime_table_state", "rewrite_small_table"]
