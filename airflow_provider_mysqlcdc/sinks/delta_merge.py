"""Apply one folded stream micro-batch to a Delta table as one MERGE commit, at most once.

Why a MERGE tagged with a Delta transaction identifier ``(app_id, version)``: Spark logs a batch's
offsets before running it and marks it committed after, so a crash in between replays the same
batch id; the identifier lets this module recognise the replay and skip it for every table that
already committed it — exactly once without a distributed transaction (docs/architecture.md,
"The sink"). A batch too large for an in-memory MERGE source goes through
:mod:`~airflow_provider_mysqlcdc.sinks.delta_rewrite` instead, with the same semantics.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.core.routing import RoutedTable
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink

log = logging.getLogger(__name__)

#: Marks the delete rows of a MERGE source; a table may not have a column of this name.
DELETE_FLAG = "__mysqlcdc_delete__"
#: Commits retried on a concurrent writer's conflict before giving up.
COMMIT_ATTEMPTS = 20
#: False: delta-rs materialises the (small) MERGE source and derives an early pruning predicate
#: from its key ranges, so target files whose key min/max statistics lie outside the batch's range
#: are neither read nor rewritten; the default streamed execution reads every file (bench/RESULTS.md,
#: "Delta MERGE"). Explicit ``t.k BETWEEN lo AND hi`` bounds in the predicate gained nothing on top
#: and would need SQL literals for every key type, so there are none.
MERGE_STREAMED_EXEC = False


def delta_arrow_schema(dt: DeltaTable) -> pa.Schema:
    """The table's current schema as Arrow (what every write must conform to)."""
    return pa.schema(dt.schema().to_arrow())


def already_applied(dt: DeltaTable, table: str, app_id: str, version: int) -> bool:
    """Whether ``table`` records batch ``version`` (or a later one) of ``app_id``: a replay to skip."""
    done = dt.transaction_version(app_id)
    if done is not None and done >= version:
        log.info("%s: batch %s/%s already applied (table records %s); skipped", table, app_id, version, done)
        return True
    return False


def merge_changes(
    sink: DeltaSink,
    table: str,
    upserts: pa.Table,
    deletes: pa.Table,
    primary_key: Sequence[str],
    app_id: str,
    version: int,
    *,
    before_merge: Callable[[], None] | None = None,
    fill_absent: bool = False,
) -> bool:
    """Apply one folded micro-batch of ``table`` as one MERGE commit, at most once per batch id.

    ``upserts`` are full rows (every column of the Delta table; extra columns mean the schema
    changed: call :meth:`DeltaSink.evolve_schema` first); ``deletes`` hold the primary-key columns of the
    keys to delete. Together they must name each key at most once — what
    :func:`~airflow_provider_mysqlcdc.core.change_block.fold_block` returns — because two source
    rows for one key would insert it twice. Matched keys are deleted or updated (all columns),
    unmatched upserts are inserted; the join is on every primary-key column.

    The commit carries the Delta transaction identifier ``(app_id, version)``. If the table
    already records ``version`` or a later one for ``app_id``, nothing happens and the result
    is False: this is what makes a replay safe when the stream crashed after the Delta commit
    but before its own checkpoint (and what keeps an older batch from overwriting newer rows).
    Versions are per table, so each table can be at a different batch id.

    Returns True when this call recorded ``version`` (one MERGE commit, or an empty commit
    that only records the batch id when the MERGE changed nothing — delta-rs writes no commit
    for a no-op MERGE, and an unrecorded batch id would make a replay re-run it against a
    table that may have moved on). An empty batch (no upserts, no deletes) makes no commit and
    returns False. A conflicting concurrent commit is retried on a fresh snapshot: delta-rs
    rejects the MERGE when another writer (a snapshot group) committed, after the MERGE read
    the table, files whose key statistics overlap the batch's key range; files outside the
    range do not conflict and the MERGE commits on top of them.

    Cost: copy-on-write. The MERGE prunes files by the key min/max statistics (the snapshot
    commit writes them for key columns; delta-rs writes them for its own files) and rewrites
    every file that holds a matched key. delta-rs writes the rewritten rows as few large files
    (``delta.targetFileSize``), so after one batch spread over all keys a table can collapse
    into one file that every later batch rewrites; a smaller ``delta.targetFileSize`` keeps
    batches proportional to what they touch (bench/RESULTS.md, "Delta MERGE").

    ``before_merge`` runs after the table was read and before the MERGE commits: a seam for
    tests that interleave another writer deterministically. Not for production use.
    """
    if not primary_key:
        raise ValueError(f"apply_changes({table}): primary_key is empty; a MERGE needs the key columns")
    if not app_id:
        raise ValueError(f"apply_changes({table}): app_id is empty; the batch id needs an application id")
    if version < 0:
        raise ValueError(f"apply_changes({table}): batch version {version} is negative")
    if upserts.num_rows == 0 and deletes.num_rows == 0:
        log.debug("%s: batch %s/%s is empty; nothing to commit", table, app_id, version)
        return False
    pk = list(primary_key)
    rerun = False  # True once this call recorded the batch id itself and must re-check the result
    for attempt in range(COMMIT_ATTEMPTS):
        dt = sink.open(table)
        sink.check_owner(table, dt)
        if not rerun and already_applied(dt, table, app_id, version):
            return False
        source = _merge_source(table, delta_arrow_schema(dt), upserts, deletes, pk, fill_absent)
        read_version = dt.version()
        commit = CommitProperties(
            app_transactions=[Transaction(app_id, version)],
            custom_metadata={"mysqlcdc": json.dumps({
                "app_id": app_id, "version": version, "upserts": upserts.num_rows, "deletes": deletes.num_rows,
            })},
        )  # fmt: skip
        if before_merge is not None:
            before_merge()
        started = time.perf_counter()
        try:
            metrics = (
                dt.merge(
                    source,
                    predicate=_merge_predicate(pk),
                    source_alias="s",
                    target_alias="t",
                    streamed_exec=MERGE_STREAMED_EXEC,
                    commit_properties=commit,
                )
                .when_matched_delete(predicate=f"s.{DELETE_FLAG} = true")
                .when_matched_update_all(predicate=f"s.{DELETE_FLAG} = false", except_cols=[DELETE_FLAG])
                .when_not_matched_insert_all(predicate=f"s.{DELETE_FLAG} = false", except_cols=[DELETE_FLAG])
                .execute()
            )
        except CommitFailedError as exc:
            log.info("%s: MERGE of batch %s/%s conflicted with a concurrent commit (%s); retrying",
                     table, app_id, version, str(exc).splitlines()[0])  # fmt: skip
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        log.info(
            "%s: batch %s/%s merged in %.3fs (%d upserts, %d deletes; files added %s, removed %s, rows copied %s)",
            table, app_id, version, time.perf_counter() - started, upserts.num_rows, deletes.num_rows,
            metrics.get("num_target_files_added"), metrics.get("num_target_files_removed"),
            metrics.get("num_target_rows_copied"),
        )
        if dt.version() > read_version or rerun:
            return True
        # A no-op MERGE (e.g. only deletes of absent keys) commits nothing: record the batch id
        # with an empty commit. If another writer committed after our read, the no-op verdict
        # may be stale, so run the MERGE once more on the newer snapshot.
        try:
            dt.create_write_transaction([], mode="append", schema=dt.schema(), commit_properties=commit)
        except CommitFailedError:
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        if sink.open(table).version() == read_version + 1:
            return True
        rerun = True
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts conflicted with "
        "concurrent commits; is another job writing this table?"
    )


def replace_rows(
    sink: DeltaSink, table: str, rows: pa.Table | pa.RecordBatchReader, app_id: str, version: int
) -> bool:
    """Make ``rows`` the whole content of ``table`` in one commit, at most once per batch id.

    What a micro-batch holding a TRUNCATE (or a DROP, policy ``evolve``) of the table applies: the
    rows its changes after the DDL leave (docs/architecture.md, "Schema changes"). One overwrite
    commit tagged ``(app_id, version)`` like :func:`merge_changes`, so a reader sees the table
    before the batch or after it, never empty in between, and a replay skips it. Returns True when
    this call committed. A routed table's shard is replaced, the other shards' rows stay."""
    route = sink.route_of(table)
    if route:
        app_id = route.app_id(app_id)
    for attempt in range(COMMIT_ATTEMPTS):
        dt = sink.open(table)
        sink.check_owner(table, dt)
        if already_applied(dt, table, app_id, version):
            return False
        target = delta_arrow_schema(dt)
        data: pa.Table | pa.RecordBatchReader = rows
        if route:
            data = _stamped(rows, route)
        if not isinstance(data, pa.RecordBatchReader):
            data = conform_upserts(table, target, data, fill_absent=route is not None)
        commit = CommitProperties(
            app_transactions=[Transaction(app_id, version)],
            custom_metadata={"mysqlcdc": json.dumps({"app_id": app_id, "version": version, "replaced": True})},
        )
        try:
            write_deltalake(dt, data, mode="overwrite", commit_properties=commit,
                            predicate=route.predicate() if route else None)  # fmt: skip
        except CommitFailedError as exc:
            if isinstance(rows, pa.RecordBatchReader):
                raise  # consumed: the caller retries the batch
            log.info("%s: replacing the rows of batch %s/%s conflicted (%s); retrying",
                     table, app_id, version, str(exc).splitlines()[0])  # fmt: skip
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        log.info("%s: batch %s/%s replaced the table's rows (version %s)", table, app_id, version, dt.version())
        return True
    raise RuntimeError(f"could not replace the rows of {table}: {COMMIT_ATTEMPTS} attempts conflicted")


def _stamped(rows: pa.Table | pa.RecordBatchReader, route: RoutedTable) -> pa.Table | pa.RecordBatchReader:
    """Rows of a routed table with its source columns, for a table or streamed batch by batch."""
    from airflow_provider_mysqlcdc.sinks.delta_routing import stamp_source

    if isinstance(rows, pa.Table):
        return stamp_source(rows, route)
    stamped = stamp_source(rows.schema.empty_table(), route).schema
    batches = (b for t in (stamp_source(pa.Table.from_batches([b]), route) for b in rows) for b in t.to_batches())
    return pa.RecordBatchReader.from_batches(stamped, batches)


def conform_upserts(table: str, target: pa.Schema, upserts: pa.Table, fill_absent: bool = False) -> pa.Table:
    """``upserts`` as full rows of the Delta table: its columns, in its order, cast to its types.

    Safe casts (an overflow raises), so a batch may carry the narrower types of the source before a
    widening; columns the table lacks fail, so a schema change the caller has not applied with
    ``evolve_schema`` is never silently dropped. ``fill_absent``: columns the rows lack are NULL (a
    routed shard whose ADD COLUMN has not happened yet, while another shard's has).
    """
    extra = [c for c in upserts.column_names if c not in target.names]
    if extra:
        raise ValueError(
            f"{table}: upserts carry columns {extra} that its Delta table lacks; apply the source's schema "
            "change with DeltaSink.evolve_schema before applying rows of the new schema"
        )
    if not upserts.num_rows:
        return target.empty_table()
    absent = [f.name for f in target if f.name not in upserts.column_names]
    if absent and not fill_absent:
        raise ValueError(f"{table}: upserts lack columns {absent}; upserts must be full rows (binlog_row_image=FULL)")
    n = upserts.num_rows
    cols = [upserts.column(f.name).cast(f.type) if f.name not in absent else pa.nulls(n, f.type) for f in target]
    return pa.Table.from_arrays(cols, schema=target)


def _merge_source(
    table: str, target: pa.Schema, upserts: pa.Table, deletes: pa.Table, primary_key: list[str],
    fill_absent: bool = False,
) -> pa.Table:
    """One MERGE source: upsert rows and delete keys, cast to the table's types, plus a delete flag.

    Casting here (safe casts: an overflow raises) means the batch may carry the narrower types of
    the source before a widening; failing on unknown columns means a schema change the caller has
    not applied with ``evolve_schema`` is never silently dropped.
    """
    if DELETE_FLAG in target.names:
        raise ValueError(f"{table} has a column named {DELETE_FLAG}, which the sink reserves")
    missing_pk = [c for c in primary_key if c not in target.names]
    if missing_pk:
        raise ValueError(f"{table}: primary key columns {missing_pk} are not columns of its Delta table")
    upserts = conform_upserts(table, target, upserts, fill_absent)
    absent_keys = [c for c in primary_key if c not in deletes.column_names]
    if deletes.num_rows and absent_keys:
        raise ValueError(f"{table}: deletes lack primary key columns {absent_keys}")

    pk = set(primary_key)
    up_cols = [upserts.column(f.name) if upserts.num_rows else pa.nulls(0, f.type) for f in target]
    del_cols = [
        deletes.column(f.name).cast(f.type) if f.name in pk and deletes.num_rows else pa.nulls(deletes.num_rows, f.type)
        for f in target
    ]
    schema = pa.schema([*(pa.field(f.name, f.type, nullable=True) for f in target), (DELETE_FLAG, pa.bool_())])
    source = pa.concat_tables([
        pa.Table.from_arrays([*up_cols, pa.array([False] * upserts.num_rows, pa.bool_())], schema=schema),
        pa.Table.from_arrays([*del_cols, pa.array([True] * deletes.num_rows, pa.bool_())], schema=schema),
    ])
    keys = list(zip(*(source.column(c).to_pylist() for c in primary_key), strict=True))
    if len(set(keys)) != len(keys):
        seen: set[tuple[Any, ...]] = set()
        dup = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(
            f"{table}: key {dup} occurs more than once among the batch's upserts and deletes; fold the batch "
            "first (core.change_block.fold_block) — a MERGE would insert such a key twice"
        )
    return source


def _merge_predicate(primary_key: list[str]) -> str:
    """Join on every key column (no null-safe compare needed: key columns are NOT NULL at the source)."""
    return " AND ".join(f"t.{_ident(c)} = s.{_ident(c)}" for c in primary_key)


def _ident(name: str) -> str:
    """A column reference for delta-rs SQL predicates (backticks, which delta-rs documents)."""
    if "`" in name:
        raise ValueError(f"column name {name!r} contains a backtick, which delta-rs predicates cannot quote")
    return f"`{name}`"


__all__ = [
    "COMMIT_ATTEMPTS", "DELETE_FLAG", "already_applied", "conform_upserts", "delta_arrow_schema", "merge_changes",
]  # fmt: skip
