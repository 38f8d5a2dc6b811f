"""Delta Lake sink (delta-rs via the ``deltalake`` package): one Delta table per source table.

Snapshot groups are committed by *adopting* the Parquet files Spark staged inside the table's
directory — no second pass over the data. Each commit is one Delta transaction that removes every
file an earlier attempt of the same group added and adds the new ones, so re-running a chunk or a
whole group is idempotent, and a crash before the commit leaves nothing visible (the orphaned
staged files are invisible to readers and removed by VACUUM). Concurrent groups commit
concurrently: they touch disjoint files, which delta-rs' conflict checker accepts.

:class:`DeltaSink` is the one handle the rest of the package writes through (table locations,
ownership, snapshot commits, reads). Applying a stream batch lives in
:mod:`~airflow_provider_mysqlcdc.sinks.delta_merge` (one MERGE, skipped on replay by its
transaction identifier), :mod:`~airflow_provider_mysqlcdc.sinks.delta_rewrite` (the same in
bounded memory) and :mod:`~airflow_provider_mysqlcdc.sinks.delta_small_table` (small tables, from
the state carried in :attr:`DeltaSink.table_states`); following an ``ALTER TABLE`` in
:mod:`~airflow_provider_mysqlcdc.sinks.delta_schema`.
See docs/architecture.md, "The sink".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import TableNotFoundError

from airflow_provider_mysqlcdc import storage as lake_storage
from airflow_provider_mysqlcdc.core.records import StagedFile
from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS, RoutedTable, Routes
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.sinks.delta_files import (
    FileActions,
    add_actions,
    commit_file_actions,
    relative_path,
    remove_action,
)
from airflow_provider_mysqlcdc.sinks.delta_merge import delta_arrow_schema, merge_changes
from airflow_provider_mysqlcdc.sinks.delta_properties import set_table_properties
from airflow_provider_mysqlcdc.sinks.delta_routing import (
    check_shard_evolution,
    check_shard_schema,
    file_schema,
    routed_schema,
    shard_files,
    stamp_source,
)
from airflow_provider_mysqlcdc.sinks.delta_schema import (
    SchemaEvolution,
    UnsupportedSchemaChange,
    evolve_table_schema,
    table_description,
)
from airflow_provider_mysqlcdc.sinks.delta_stats import declared_stats_columns, stats_columns_for, stats_properties
from airflow_provider_mysqlcdc.sinks.delta_superseded import SupersededFiles
from airflow_provider_mysqlcdc.sinks.delta_table_state import TableStates

log = logging.getLogger(__name__)

SNAPSHOT_DIR = "snapshot"


def _group_prefix(group_key: str, route: RoutedTable | None = None) -> str:
    # a routed shard's files get a directory of their own: shards of one group share the table
    return f"{SNAPSHOT_DIR}/{group_key}/" + (f"{route.source}/" if route else "")


#: Table property naming the pipeline that owns (writes) a Delta table.
OWNER_PROPERTY = "mysqlcdc.pipeline"


class TableOwnedError(RuntimeError):
    """A Delta table belongs to another pipeline; the message names it and the way to take it over."""


class DeltaSink:
    """``<root>/<db>/<table>`` Delta tables. ``root`` is a local path or a URL delta-rs understands.

    ``owner`` is the pipeline writing through this sink: tables it creates record it in the table
    property :data:`OWNER_PROPERTY`, and every write to a table another pipeline owns is refused
    (two streams applying to one table would each overwrite the other's rows) unless the table is
    in ``takeover`` — then the table becomes this pipeline's when its re-snapshot is swapped in.
    Without ``owner`` (tests, tools) nothing is checked.

    ``routes``: source tables a route sends to a shared Delta table (core/routing.py). Every method
    taking a source table then works on that table's partition of the target: its files, its rows,
    its batch ids (docs/architecture.md, "Routing sharded tables").

    ``small_table_retention_seconds``: files the small tables' batches supersede are deleted this
    long after (:attr:`superseded`), and a small table is rewritten whole at most once per that
    time (docs/architecture.md, "Committing small tables": *Disk*); None: they are left to the
    maintenance vacuum and every batch rewrites the table whole (the sink of a tool or a test).
    """

    def __init__(
        self,
        root: str,
        storage: lake_storage.LakeStorage | None = None,
        owner: str | None = None,
        takeover: Iterable[str] = (),
        routes: Routes | None = None,
        rewrite_below_bytes: int = 0,
        deletion_vectors: bool = False,
        small_table_retention_seconds: float | None = None,
    ):
        if not root:
            raise ValueError("sink_root is empty: give the directory or URL where Delta tables should go")
        self.root = str(root).rstrip("/")
        self.storage = storage or lake_storage.LOCAL
        self.storage_options = self.storage.delta_options(self.root)
        self.owner = owner
        self.takeover = set(takeover)
        self.routes = routes or Routes()
        # stream batches into tables this small are applied by a direct file rewrite, not a MERGE
        self.rewrite_below_bytes = rewrite_below_bytes
        # bigger ones (one integer key) by deletion vectors instead of a MERGE (sinks/delta_dv_table.py)
        self.deletion_vectors = deletion_vectors
        self.dv_blocked: dict[str, str] = {}  # table URI -> why it keeps the MERGE (logged once)
        self._loaded: dict[str, DeltaTable] = {}  # tables the stream applies to, brought up to date per batch
        self.table_states = TableStates()  # small tables' state carried between batches (sinks/delta_table_state.py)
        self.superseded: SupersededFiles | None = None  # superseded small-table files awaiting their grace
        self.keep_superseded_for(small_table_retention_seconds)

    def keep_superseded_for(self, seconds: float | None) -> None:
        """Delete the files small tables' batches supersede ``seconds`` after (None: never; the
        maintenance vacuum does). Files already waiting keep their time when only the setting changes."""
        if not seconds:
            self.superseded = None
        elif self.superseded is None:
            self.superseded = SupersededFiles(seconds)
        else:
            self.superseded.retention_seconds = float(seconds)

    def state_key(self, table: str) -> str:
        """The key of ``table``'s carried state: its Delta table's URI; a routed shard's, with its name."""
        route = self.route_of(table)
        uri = self.table_uri(table)
        return f"{uri}@{route.source}" if route else uri

    def route_of(self, table: str) -> RoutedTable | None:
        """Where a routed source table's rows go (None: to a Delta table of its own)."""
        return self.routes.route_of(table) if self.routes.rules else None

    # ------------------------------------------------------------------ ownership
    def owner_of(self, table: str, dt: DeltaTable | None = None) -> str | None:
        """The pipeline recorded as the table's owner (None: no table, or none recorded); ``dt``:
        the table, if loaded."""
        if dt is None and not self.exists(table):
            return None
        return _recorded_owner(dt if dt is not None else self.open(table))

    def check_owner(self, table: str, dt: DeltaTable | None = None) -> None:
        """Raise :class:`TableOwnedError` if another pipeline owns ``table`` and it is not taken over."""
        if self.owner is None or table in self.takeover:
            return
        if dt is None:
            if not self.exists(table):
                return
            dt = self.open(table)
        recorded = _recorded_owner(dt)
        if recorded is not None and recorded != self.owner:
            raise TableOwnedError(
                f"the Delta table of {table} ({self.table_uri(table)}) belongs to pipeline {recorded!r}; pipeline "
                f"{self.owner!r} may not write it — two pipelines writing one table overwrite each other's rows. "
                f"Use another sink_root, or take it over with takeover_tables=['{table}'] (it is re-snapshotted "
                f"by {self.owner!r}; the stream of {recorded!r} then stops at its next batch with this message)"
            )

    def claim(self, table: str) -> bool:
        """Record this sink's owner on ``table`` if it records another or none; True if it changed."""
        if self.owner is None or not self.exists(table):
            return False
        owner = self.owner

        def wanted(dt: DeltaTable) -> dict[str, str] | None:
            return None if _recorded_owner(dt) == owner else {OWNER_PROPERTY: owner}

        changed = set_table_properties(lambda: self.open(table), wanted, f"record the owner of {table}")
        if changed:
            log.info("%s: now owned by pipeline %s", table, owner)
        return changed

    def declare_stats_columns(self, table: str, key: Sequence[str], schema: pa.Schema | None = None,
                              opened: DeltaTable | None = None) -> None:  # fmt: skip
        """Declare on ``table`` the columns its files carry statistics for (:mod:`sinks.delta_stats`):
        those of its ``key`` that suit them. A table created before tables declared them gets them here.
        ``schema``: the columns of ``table``'s rows (default: the Delta table's own, without a routed
        table's source columns, which are partition values); ``opened``: the table, just loaded."""
        declared: list[str] = []

        def wanted(dt: DeltaTable) -> dict[str, str] | None:
            columns = schema
            if columns is None:
                full = delta_arrow_schema(dt)
                columns = file_schema(full) if self.route_of(table) else full
            declared[:] = stats_columns_for(columns, list(key))
            if declared_stats_columns(dt.metadata().configuration) == declared:
                return None
            return stats_properties(declared)

        if set_table_properties(lambda: self.open(table), wanted, f"declare the statistics columns of {table}",
                                opened):
            log.info("%s: file statistics declared for %s", table, ", ".join(declared) or "no column")

    def table_uri(self, table: str) -> str:
        route = self.route_of(table)
        return f"{self.root}/{TableId.parse(route.target if route else table).path}"

    def _is_local(self) -> bool:
        return lake_storage.is_local(self.root)

    def open(self, table: str) -> DeltaTable:
        return DeltaTable(self.table_uri(table), storage_options=self.storage_options)

    def read(self, table: str) -> pa.Table:
        """The whole current table as Arrow, read with delta-rs' own engine (DataFusion).

        ``DeltaTable.to_pyarrow_table`` (a pyarrow dataset over delta-rs' filesystem handler) aborts
        the interpreter at exit now and then on this stack (deltalake 1.6.6 / pyarrow 26), which
        turns a finished program's exit code into 134.
        """
        dt = self.open(table)
        route = self.route_of(table)
        where = f" WHERE {route.predicate()}" if route else ""  # a routed table: its shard's rows
        out = pa.table(QueryBuilder().register("t", dt).execute(f"SELECT * FROM t{where}").read_all())
        # DataFusion hands back string_view/binary_view columns; give callers the table's own types.
        out = out.cast(delta_arrow_schema(dt))
        return out.drop_columns(list(SOURCE_COLUMNS)) if route else out

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.table_uri(table), storage_options=self.storage_options)

    # ------------------------------------------------------------------ snapshot
    def prepare_table(self, table: str, schema: pa.Schema, primary_key: list[str]) -> None:
        route = self.route_of(table)
        name, key = (route.target, route.merge_key(primary_key)) if route else (table, primary_key)
        if self.exists(table):
            self.check_owner(table)
            if route:
                self._check_shard_schema(table, route, schema)
            self.declare_stats_columns(table, key, schema)
            return
        uri = self.table_uri(table)
        if self._is_local():
            os.makedirs(uri, exist_ok=True)
        try:
            DeltaTable.create(
                uri,
                self.lake_schema(table, schema),
                mode="ignore",  # another group may create it concurrently
                partition_by=list(SOURCE_COLUMNS) if route else None,
                name=name,
                description=table_description(name, key),  # evolve_schema reads the key back
                configuration={"delta.appendOnly": "false", **stats_properties(stats_columns_for(schema, key))},
                storage_options=self.storage_options,
            )
        except Exception as exc:  # lost a creation race: fine if the table now exists
            if not self.exists(table):
                raise
            log.debug("table %s created concurrently (%s)", table, exc)
        # delta-rs refuses unknown properties at creation but accepts them in an ALTER
        self.check_owner(table)
        self.claim(table)

    def lake_schema(self, table: str, schema: pa.Schema) -> pa.Schema:
        """The Delta table's schema for ``table``'s rows: a routed table's starts with the source columns."""
        return routed_schema(schema) if self.route_of(table) else schema

    def _check_shard_schema(self, table: str, route: RoutedTable, schema: pa.Schema) -> None:
        """A shard's columns fit the shared table; the ones it lacks are added (NULL in other shards)."""
        current = delta_arrow_schema(self.open(table))
        wider = check_shard_schema(table, route, current, schema)
        if wider is not None:
            evolve_table_schema(self, table, routed_schema(wider), None)
            log.info("%s: columns %s added to %s (NULL in the other shards' rows)", table,
                     [n for n in wider.names if n not in current.names], route.target)  # fmt: skip

    def recreate_table(self, table: str, schema: pa.Schema, primary_key: list[str]) -> None:
        """Empty ``table``'s Delta table and give it ``schema``: a source table created again under a
        captured name starts over (the old rows stay in the Delta history until vacuumed)."""
        self.table_states.forget(self.table_uri(table))
        dt = self.open(table)
        self.check_owner(table, dt)
        route = self.route_of(table)
        if route:  # only this shard's rows go; the shared table keeps its schema (checked)
            self._check_shard_schema(table, route, schema)
            dt.delete(route.predicate())
            log.info("%s: created again in the source; its rows in %s start over", table, route.target)
            return
        write_deltalake(dt, schema.empty_table(), mode="overwrite", schema_mode="overwrite")
        dt = self.open(table)
        dt.alter.set_table_description(table_description(table, primary_key))
        log.info("%s: created again in the source; its Delta table starts over (version %s)", table, dt.version())

    def copy_rows(self, source: str, table: str) -> int:
        """Make ``table`` hold exactly ``source``'s rows, with its schema, in one commit (streamed:
        memory stays bounded by a batch). An online schema change's cut-over: the original table
        continues from its shadow's rows. Returns the new version."""
        if self.route_of(table) or self.route_of(source):
            raise UnsupportedSchemaChange(
                f"an online schema change renamed {source} into {table}, and routed tables cannot continue from "
                f"a shadow copy: re-snapshot it with resnapshot_tables=['{table}']"
            )
        self.table_states.forget(self.table_uri(table))
        dt = self.open(table)
        self.check_owner(table, dt)
        scan = QueryBuilder().register("s", self.open(source)).execute("SELECT * FROM s")
        write_deltalake(dt, pa.RecordBatchReader.from_stream(scan), mode="overwrite", schema_mode="overwrite")
        version = self.open(table).version()
        log.info("%s: now holds the rows of %s (version %s)", table, source, version)
        return version

    def staging_location(self, table: str, group_key: str, attempt: str) -> str:
        return f"{self.table_uri(table)}/{_group_prefix(group_key, self.route_of(table))}{attempt}"

    def commit_snapshot_group(
        self,
        table: str,
        group_key: str,
        files: list[StagedFile],
        schema: pa.Schema,
        metadata: dict[str, Any],
    ) -> int:
        """One Delta commit: remove this group's earlier files, add ``files``. Returns the new version."""
        uri = self.table_uri(table)
        route = self.route_of(table)
        prefix = _group_prefix(group_key, route)

        def actions(have: dict[str, int], now: int, stats: list[str] | None) -> FileActions:
            removes = [remove_action(p, sz, now) for p, sz in have.items() if p.startswith(prefix)]
            return removes, add_actions(uri, files, stats, now, prefix, self.storage, route)

        version, removed, _ = commit_file_actions(self, table, actions, schema, metadata, skip_if_unchanged=False)
        log.info(
            "%s: committed group %s (%d files, %d rows; replaced %d earlier files) as version %s",
            table, group_key, len(files), sum(f.rows for f in files), removed, version,
        )
        assert version is not None
        return version

    def replace_with_files(
        self,
        table: str,
        files: list[StagedFile],
        schema: pa.Schema,
        metadata: dict[str, Any],
    ) -> int | None:
        """One Delta commit after which the table holds exactly ``files`` (a re-snapshot's swap).

        Readers see the old table until this commit and the new one after it, never a mix and
        never an empty table. Set-based, so a repeat after a crash is a no-op: files already in the
        table stay, every other file is removed. Returns the new version, or None if nothing changed.
        """
        uri = self.table_uri(table)
        self.table_states.forget(uri)
        wanted = {relative_path(uri, f.path): f for f in files}

        def actions(have: dict[str, int], now: int, stats: list[str] | None) -> FileActions:
            removes = [remove_action(p, sz, now) for p, sz in have.items() if p not in wanted]
            adds = [f for p, f in wanted.items() if p not in have]
            return removes, add_actions(uri, adds, stats, now, storage=self.storage,
                                         route=self.route_of(table))  # fmt: skip

        version, removed, added = commit_file_actions(self, table, actions, schema, metadata, skip_if_unchanged=True,
                                                     new_schema=True)  # fmt: skip
        self.claim(table)  # a taken-over table is this pipeline's from its re-snapshot on
        if version is None:
            log.info("%s: already holds exactly the re-snapshot's %d files", table, len(wanted))
        else:
            log.info(
                "%s: replaced %d files with the re-snapshot's %d files (%d rows) as version %s",
                table, removed, added, sum(f.rows for f in files), version,
            )
        return version

    def table_files(self, table: str, dt: DeltaTable | None = None) -> dict[str, int]:
        """The table's data files (relative path -> size); a routed table's: its shard's files only."""
        current = pa.table((dt or self.open(table)).get_add_actions(flatten=True)).to_pydict()
        route = self.route_of(table)
        if route is not None:
            return shard_files(current, route)
        return dict(zip(current.get("path", []), current.get("size_bytes", []), strict=False))

    # ------------------------------------------------------------------ stream
    def apply_changes(
        self,
        table: str,
        upserts: pa.Table,
        deletes: pa.Table,
        primary_key: Sequence[str],
        app_id: str,
        version: int,
        *,
        before_merge: Callable[[], None] | None = None,
    ) -> bool:
        """Apply one folded micro-batch of ``table`` as one MERGE commit, at most once per batch id.

        See :func:`~airflow_provider_mysqlcdc.sinks.delta_merge.merge_changes`. A routed table's rows
        carry its source columns, join on them too, and record the batch under its own app id.

        A table whose data files (its shard's, if routed) total at most ``rewrite_below_bytes`` takes
        the batch by a rewrite of the whole table as one file
        (:mod:`~airflow_provider_mysqlcdc.sinks.delta_small_table`) instead — the same result and the
        same batch id, without a MERGE's query planning, which is most of a small table's apply time.
        A bigger one with one integer key takes it with deletion vectors when ``deletion_vectors`` is
        set (:mod:`~airflow_provider_mysqlcdc.sinks.delta_dv_table`): only the changed rows written.
        """
        if before_merge is None and (upserts.num_rows or deletes.num_rows):
            from airflow_provider_mysqlcdc.sinks.delta_apply_path import apply_without_merge  # builds on this class

            applied = apply_without_merge(self, table, upserts, deletes, list(primary_key), app_id, version)
            if applied is not None:  # None: the MERGE (a big table the deletion vectors do not serve, or off)
                return applied
        route = self.route_of(table)
        if route:
            upserts, deletes = stamp_source(upserts, route), stamp_source(deletes, route)
            primary_key, app_id = route.merge_key(primary_key), route.app_id(app_id)
        return merge_changes(
            self, table, upserts, deletes, primary_key, app_id, version, before_merge=before_merge,
            fill_absent=route is not None,
        )

    def latest(self, table: str) -> DeltaTable:
        """``table`` at its latest version: loaded once, then only the log entries since read (a full
        load replays the log since its last checkpoint, several times the cost for a small table)."""
        dt = self._loaded.get(self.table_uri(table))
        if dt is None:
            dt = self._loaded[self.table_uri(table)] = self.open(table)
        else:
            try:
                dt.update_incremental()
            except Exception as exc:  # the entries since its version were cleaned up (a small table's short log)
                log.debug("%s: loaded again (%s)", table, exc)
                dt = self._loaded[self.table_uri(table)] = self.open(table)
        return dt

    def evolve_schema(
        self,
        table: str,
        new_schema: pa.Schema,
        primary_key: Sequence[str] | None = None,
        *,
        drop_columns: Sequence[str] = (),
        rename_columns: Mapping[str, str] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> SchemaEvolution:
        """Make the Delta table of ``table`` follow a source ``ALTER TABLE``; idempotent.

        See :func:`~airflow_provider_mysqlcdc.sinks.delta_schema.evolve_table_schema`.
        """
        self.table_states.forget(self.table_uri(table))
        self.dv_blocked.pop(self.table_uri(table), None)
        route = self.route_of(table)
        if route:  # a shared table follows one shard's ADD COLUMN only
            check_shard_evolution(table, route, delta_arrow_schema(self.open(table)), new_schema, drop_columns,
                                  rename_columns)  # fmt: skip
            new_schema = routed_schema(new_schema)
            primary_key = None if primary_key is None else route.merge_key(primary_key)
        return evolve_table_schema(self, table, new_schema, primary_key, drop_columns=drop_columns,
                                   rename_columns=rename_columns, before_commit=before_commit)  # fmt: skip


def _recorded_owner(dt: DeltaTable) -> str | None:
    return (dt.metadata().configuration or {}).get(OWNER_PROPERTY) or None


__all__ = [
    "OWNER_PROPERTY",
    "DeltaSink",
    "SchemaEvolution",
    "StagedFile",
    "TableNotFoundError",
    "TableOwnedError",
    "UnsupportedSchemaChange",
]
