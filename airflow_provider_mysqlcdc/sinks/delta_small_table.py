"""Apply a stream batch to a SMALL Delta table from the rows the stream carries, in one commit.

Why: a database of hundreds of small tables gets a batch touching most of them; a delta-rs MERGE
plans a DataFusion query per call, which is most of a small table's apply time, and a file-by-file
rewrite leaves one more file per batch to match next time. A table of a few MiB is kept in memory
and its batch is committed as one log entry that carries the Delta transaction
``(app_id, version)`` (a replay is skipped) — the same result as the MERGE
(docs/architecture.md, "Applying a batch's tables at once"). Bigger tables keep the MERGE
(:mod:`~airflow_provider_mysqlcdc.sinks.delta_merge`) or take deletion vectors.

What the batch writes (:mod:`~airflow_provider_mysqlcdc.sinks.delta_small_marks`): the table
rewritten whole as ONE sorted file, or — while a copy an earlier rewrite superseded is still kept
for readers (:mod:`~airflow_provider_mysqlcdc.sinks.delta_superseded`) — its changed rows marked
deleted with deletion vectors and one file of the batch's rows added. Files a commit supersedes are
deleted once their grace has passed, so the table's disk stays a small multiple of its live data
whatever its churn (docs/architecture.md, "Committing small tables": *Disk*).

The stream carries each table's state from batch to batch
(:mod:`~airflow_provider_mysqlcdc.sinks.delta_table_state`) and commits by writing the next log
entry itself (:mod:`~airflow_provider_mysqlcdc.sinks.delta_log`): no log reload, no transaction
lookup and no file read per batch while it is the only writer. A routed shard carries a state of
its own partition and catches up with its sibling shards' commits before its own (they touch other
partitions). A table whose protocol or storage the direct commit does not serve goes through
delta-rs' transaction instead, rewritten whole.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS
from airflow_provider_mysqlcdc.sinks.deletion_vector import keep_mask
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_purge import FEATURE, has_vectors_feature, purge_deletion_vectors
from airflow_provider_mysqlcdc.sinks.delta_files import remove_action
from airflow_provider_mysqlcdc.sinks.delta_log import (
    PLAIN_WRITER_FEATURES,
    LogConflict,
    checkpoint_due,
    commit_actions,
    log_writable,
    unsupported_reason,
)
from airflow_provider_mysqlcdc.sinks.delta_log_replay import replay
from airflow_provider_mysqlcdc.sinks.delta_maintenance import retention_properties, small_table
from airflow_provider_mysqlcdc.sinks.delta_merge import (
    COMMIT_ATTEMPTS,
    already_applied,
    conform_upserts,
    delta_arrow_schema,
)
from airflow_provider_mysqlcdc.sinks.delta_properties import set_table_properties
from airflow_provider_mysqlcdc.sinks.delta_rewrite import _added, _conform, _FileWriter, _TableFiles, checkpoint_table
from airflow_provider_mysqlcdc.sinks.delta_routing import file_schema
from airflow_provider_mysqlcdc.sinks.delta_small_marks import (
    BatchPlan,
    catch_up,
    changed_keys,
    commit_details,
    mark_plan,
    may_mark,
    read_log_view,
    vector_files_of,
    whole_plan,
)
from airflow_provider_mysqlcdc.sinks.delta_table_state import Located, TableState
from airflow_provider_mysqlcdc.spill.changed_keys import member_mask

log = logging.getLogger(__name__)

#: Writer features a direct commit honours: the plain set, and deletion vectors (a remove carries
#: the file's vector; the batches that mark rows write them).
SMALL_WRITER_FEATURES = PLAIN_WRITER_FEATURES | {FEATURE}


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
    """Make ``table`` (its shard, if routed) its rows minus the changed keys plus ``upserts``, in one
    commit tagged ``(app_id, version)``; False if the table already records ``version``.

    ``upserts``/``deletes`` are a folded batch (each key once), as for :meth:`DeltaSink.apply_changes`.
    ``opened``: the table at its latest version, if the caller has it.
    """
    if log_writable(sink.storage, sink.table_uri(table)):
        return _apply_by_log(sink, table, upserts, deletes, list(primary_key), app_id, version, opened)
    return _rewrite_by_delta_rs(sink, table, upserts, deletes, list(primary_key), app_id, version, opened)


def load_state(sink: DeltaSink, table: str, dt: DeltaTable, app_id: str) -> TableState:
    """``table``'s state read from ``dt`` (a routed shard's: its partition's files and batch ids; a
    table with the deletion-vector feature: its vectors too). ``app_id``: the stream's. A small
    table is first given the small tables' retention (as maintenance would, one round later), so
    its log and checkpoints keep no more history than its files from its first batch on."""
    state = _state_of(sink, table, dt, app_id)
    if state.log_blocker is None and _shorten_history(sink, table, dt):
        dt = sink.latest(table)
        state = _state_of(sink, table, dt, app_id)
    if state.log_blocker is None and has_vectors_feature(dt):
        state.adds = {}  # rows are read knowing the vectors
        if not read_log_view(sink, state):
            raise LogConflict(f"{table} changed while its state was read")
    return state


def _state_of(sink: DeltaSink, table: str, dt: DeltaTable, app_id: str) -> TableState:
    route = sink.route_of(table)
    return TableState.of(sink.table_uri(table), dt, unsupported_reason(dt, SMALL_WRITER_FEATURES),
                         route.app_id(app_id) if route else app_id,
                         schema=file_schema(delta_arrow_schema(dt)) if route else None,
                         partition=route.partition_values if route else None, key=sink.state_key(table))  # fmt: skip


def _shorten_history(sink: DeltaSink, table: str, dt: DeltaTable) -> bool:
    """Give a small table (every shard of it small) the small tables' retention for its removed files
    and its log (``delta_maintenance.small_table``); True if that took a commit."""
    keep = sink.superseded
    if keep is None or not small_table(sink, dt):
        return False
    wanted = retention_properties(keep.retention_seconds, keep.retention_seconds)

    def differs(current: DeltaTable) -> dict[str, str] | None:
        conf = current.metadata().configuration or {}
        return wanted if any(conf.get(k) != v for k, v in wanted.items()) else None

    changed = set_table_properties(lambda: sink.open(table), differs, f"set the retention of {table}", dt)
    if changed:
        log.info("%s: a small table: it keeps %.0fs of history (superseded files, log entries)", table,
                 keep.retention_seconds)  # fmt: skip
    return changed


def _apply_by_log(sink: DeltaSink, table: str, upserts: pa.Table, deletes: pa.Table, key: list[str],
                  app_id: str, version: int, opened: DeltaTable | None) -> bool:  # fmt: skip
    """The batch from the carried state, committed by writing the log entry (module doc)."""
    route = sink.route_of(table)
    shard_app = route.app_id(app_id) if route else app_id
    states, skey = sink.table_states, sink.state_key(table)
    dt = opened
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            state = _current_state(sink, table, app_id, shard_app, dt)
        except LogConflict:
            states.forget_key(skey)
            dt = None
            continue
        if state.log_blocker is not None:
            log.debug("%s: committed through delta-rs (its %s asks more of a writer than a direct log entry)",
                      table, state.log_blocker)  # fmt: skip
            states.forget_key(skey)
            return _rewrite_by_delta_rs(sink, table, upserts, deletes, key, app_id, version, dt)
        done = state.recorded(shard_app, None)
        if done is not None and done >= version:
            log.info("%s: batch %s/%s already applied (table records %s); skipped", table, shard_app, version, done)
            return False
        files = _TableFiles.of(sink, table, route)
        if state.rows is None or state.located is None:
            state.rows, state.located = _read_rows(files, state)
        known = state.adds is not None and state.protocol is not None
        mark = may_mark(sink, state) and (known or read_log_view(sink, state))
        now = int(time.time() * 1000)
        build = mark_plan if mark else whole_plan
        plan = build(files, state, table, upserts, deletes, key, version, route is not None, now)
        try:
            committed = _commit(sink, state, plan, shard_app, version, upserts.num_rows, deletes.num_rows)
        except LogConflict:
            log.info("%s: version %s was committed by another writer since this stream's last commit; reading the "
                     "table again for batch %s/%s", table, state.version + 1, shard_app, version)  # fmt: skip
            _discard(sink, state.uri, plan)
            states.forget_key(skey)
            dt = None
            time.sleep(min(0.01 * attempt, 1.0))
            continue
        _take(sink, state, plan, committed, shard_app, version)
        log.debug("%s: batch %s/%s %s (%d rows; %d upserts, %d deletes) as version %s", table, shard_app, version,
                  "rewrote the table" if plan.whole else f"marked {plan.details['marked_rows']} rows",
                  plan.rows.num_rows, upserts.num_rows, deletes.num_rows, committed)  # fmt: skip
        if checkpoint_due(committed, state.configuration):
            checkpoint_table(sink, table)
        return True
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts found a newer version "
        "committed by another writer; is another job writing this table?"
    )


def _current_state(sink: DeltaSink, table: str, app_id: str, shard_app: str, dt: DeltaTable | None) -> TableState:
    """The carried state, loaded if there is none; caught up with the sibling shards' commits this
    sink made since (raises LogConflict when that is not possible: read the table anew)."""
    states = sink.table_states
    state = states.get(sink.state_key(table))
    if state is None or shard_app not in state.transactions:
        dt = dt if dt is not None else sink.latest(table)
        sink.check_owner(table, dt)
        state = load_state(sink, table, dt, app_id)
        states.put(state)
    newer = states.latest_known(state.uri)
    if newer is not None and newer > state.version and not catch_up(sink, state, shard_app, newer):
        raise LogConflict(f"{table}: the commits since version {state.version} touched its files")
    return state


def _commit(sink: DeltaSink, state: TableState, plan: BatchPlan, shard_app: str, version: int, upserts: int,
            deletes: int) -> int:  # fmt: skip
    """Write ``plan``'s log entry; a commit that did not touch this shard's files made first (another
    shard's batch, a maintenance round's property set or vacuum) is caught up with and the same
    actions committed after it."""
    metadata = commit_details(plan, shard_app, version, upserts, deletes)
    for _ in range(COMMIT_ATTEMPTS):
        try:
            return commit_actions(sink.storage, state.uri, state.version, plan.actions,
                                  app_transaction=(shard_app, version), metadata=metadata,
                                  operation="WRITE" if plan.whole else "MERGE")  # fmt: skip
        except LogConflict:
            if plan.changes_metadata or not catch_up(sink, state, shard_app):
                raise
    raise LogConflict(f"{state.uri}: {COMMIT_ATTEMPTS} commits of other writers in a row")


def _discard(sink: DeltaSink, uri: str, plan: BatchPlan) -> None:
    """Delete the files of a plan whose commit lost to another writer's: no version refers to them,
    and the vacuum (which reads the log's removes) would never find them."""
    for rel in plan.written:
        sink.storage.remove(f"{uri.rstrip('/')}/{unquote(rel)}")


def _take(sink: DeltaSink, state: TableState, plan: BatchPlan, committed: int, shard_app: str, version: int) -> None:
    """``state`` after ``plan`` committed as ``committed``; what it superseded queued for deletion
    once its grace has passed, and what passed its grace deleted."""
    before = vector_files_of(state.adds or {})
    for action in plan.actions:
        if "protocol" in action:
            state.protocol = action["protocol"]
        if "metaData" in action:
            state.metadata = action["metaData"]
            state.configuration = dict(state.metadata.get("configuration") or {})
    state.adds = plan.adds  # after a whole rewrite too: its one file is known exactly
    state.vectors, state.physical, state.located = plan.vectors, plan.physical, plan.located
    sink.table_states.committed(state, committed, plan.files, plan.rows, (shard_app, version))
    superseded = sink.superseded
    if superseded is None:
        return
    after = vector_files_of(state.adds or {})
    superseded.add(state.key, state.uri, plan.superseded, data=True)
    if plan.whole and plan.superseded:
        superseded.rewrote(state.key)
    superseded.add(state.key, state.uri, {rel: n for rel, n in before.items() if rel not in after}, data=False)
    superseded.sweep(sink.storage, state.key, set(state.files) | set(after))


def sweep_superseded(sink: DeltaSink) -> int:
    """Delete the superseded files whose grace has passed of tables no batch committed to since (a
    table's own commit deletes its own); the number deleted. A file live in the table is kept: the
    carried state says what is live when it is the table's latest version, else the log does."""
    superseded = sink.superseded
    if superseded is None:
        return 0
    deleted = 0
    for key, uri in superseded.due_keys().items():
        state = sink.table_states.get(key)
        if state is not None and not sink.storage.exists(f"{uri.rstrip('/')}/_delta_log/{state.version + 1:020d}.json"):
            live = set(state.files) | set(vector_files_of(state.adds or {}))
        else:
            try:
                snapshot = replay(sink.storage, uri)
            except FileNotFoundError:  # the table is gone (dropped with its directory)
                superseded.forget(key)
                continue
            live = set(snapshot.adds) | set(vector_files_of(snapshot.adds))
        deleted += superseded.sweep(sink.storage, key, live)
    return deleted


def prime_table_state(sink: DeltaSink, table: str, dt: DeltaTable, app_id: str) -> bool:
    """Carry ``table``'s state, rows included, from the stream's start (``dt``: the table, just
    loaded) when its batches will be applied from it; True if they will. The first batch over
    hundreds of tables then reads no log, asks no batch id and reads no file, as every later one."""
    uri = sink.table_uri(table)
    if not sink.rewrite_below_bytes or not log_writable(sink.storage, uri):
        return False
    if unsupported_reason(dt, SMALL_WRITER_FEATURES) is not None:
        return False
    try:
        state = load_state(sink, table, dt, app_id)
    except LogConflict:  # committed to meanwhile: its first batch reads it
        return False
    if state.live_size > sink.rewrite_below_bytes:
        return False
    state.rows, state.located = _read_rows(_TableFiles.of(sink, table, sink.route_of(table)), state)
    sink.table_states.put(state)
    return True


def _read_rows(files: _TableFiles, state: TableState) -> tuple[pa.Table, Located]:
    """The table's live rows (less those its deletion vectors delete), read from the files ``state``
    lists, in its schema; and where each lies. Records each file's physical row count."""
    parts, file_no, position = [], [], []
    names = list(state.files)
    for n, rel in enumerate(names):
        data = _conform(files.reader(rel).read(), state.schema)
        state.physical[rel] = data.num_rows
        where = np.arange(data.num_rows, dtype=np.uint32)
        vector = state.vectors.get(rel)
        if vector is not None:
            keep = keep_mask(data.num_rows, vector)
            data, where = data.filter(pa.array(keep)), where[keep]
        parts.append(data)
        position.append(where)
        file_no.append(np.full(len(where), n, dtype=np.int32))
    if not parts:
        return state.schema.empty_table(), Located([], np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.uint32))
    return pa.concat_tables(parts), Located(names, np.concatenate(file_no), np.concatenate(position))


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
        drop = member_mask(current.select(key), changed_keys(schema, upserts, deletes, key), key)
        rows = pa.concat_tables([current.filter(pa.array(~drop)),
                                 conform_upserts(table, schema, upserts, route is not None)])  # fmt: skip
        rows = rows.sort_by([(c, "ascending") for c in key])
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
        if sink.superseded is not None:
            key_of = sink.state_key(table)
            sink.superseded.add(key_of, sink.table_uri(table), have, data=True)
            sink.superseded.sweep(sink.storage, key_of, {f.rel for f in out.written})
        return True
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts conflicted with "
        "concurrent commits; is another job writing this table?"
    )


__all__ = ["SMALL_WRITER_FEATURES", "load_state", "prime_table_state", "rewrite_small_table", "sweep_superseded"]
