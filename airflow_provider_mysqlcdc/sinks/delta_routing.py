"""A routed source table's share of a Delta table several shards write (docs/architecture.md,
"Routing sharded tables").

Why partition columns: the target's ``_source_database`` / ``_source_table`` are Delta partition
columns, so a shard's rows are exactly the files whose partition values name it. Every write of a
shard — a snapshot commit, a MERGE, a bounded rewrite, a swap — then touches its own files only,
and staged snapshot files need no extra columns (the values live in the commit's add actions).
:class:`~airflow_provider_mysqlcdc.sinks.delta.DeltaSink` calls these helpers when a table is routed.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS, RoutedTable
from airflow_provider_mysqlcdc.sinks.delta_schema import UnsupportedSchemaChange, _schema_diff, column_signature


def routed_schema(schema: pa.Schema) -> pa.Schema:
    """The shared table's schema for rows of ``schema``: the source columns first."""
    return pa.schema([*(pa.field(c, pa.string()) for c in SOURCE_COLUMNS), *schema])


def file_schema(target: pa.Schema) -> pa.Schema:
    """The columns a shared table's data files hold: its schema without the partition columns."""
    return pa.schema([f for f in target if f.name not in SOURCE_COLUMNS])


def stamp_source(rows: pa.Table, route: RoutedTable) -> pa.Table:
    """``rows`` with the routed table's source columns first (constant per shard)."""
    values = route.partition_values
    cols = [pa.array([values[c]] * rows.num_rows, pa.string()) for c in SOURCE_COLUMNS]
    return pa.Table.from_arrays([*cols, *rows.columns], names=[*SOURCE_COLUMNS, *rows.column_names])


def shard_files(add_actions: dict[str, list[Any]], route: RoutedTable) -> dict[str, int]:
    """``{path: size}`` of the files of ``route``'s shard, from ``get_add_actions(flatten=True)``."""
    paths = add_actions.get("path", [])
    sizes = add_actions.get("size_bytes", [])
    n = len(paths)
    parts = [(add_actions.get(f"partition.{c}") or [None] * n, v) for c, v in route.partition_values.items()]
    return {p: sz for i, (p, sz) in enumerate(zip(paths, sizes, strict=True)) if all(col[i] == v for col, v in parts)}


def check_shard_schema(table: str, route: RoutedTable, target: pa.Schema, schema: pa.Schema) -> pa.Schema | None:
    """A shard writing the shared table must type the columns it shares with it alike. Returns the
    shared table's schema with the shard's other columns added (None: nothing to add); a column only
    some shards have — an ADD COLUMN on its way through them — is NULL in the others' rows."""
    have = dict(column_signature(file_schema(target)))
    differ = [f"{n} ({t} here, {have[n]} in {route.target})" for n, t in column_signature(schema)
              if n in have and have[n] != t]  # fmt: skip
    if differ:
        raise UnsupportedSchemaChange(
            f"{table} is routed to {route.target}, and its columns {differ} do not fit that table: give every "
            f"shard the same column types, or route {table} to another target"
        )
    extra = [f for f in schema if f.name not in have]
    return pa.schema([*file_schema(target), *(f.with_nullable(True) for f in extra)]) if extra else None


def check_shard_evolution(
    table: str, route: RoutedTable, target: pa.Schema, new_schema: pa.Schema, drops: Any, renames: Any
) -> None:
    """A shard's ALTER is followed when it only adds columns (metadata only; the other shards' rows
    read NULL there until their own ALTER). A drop, rename or widening would rewrite every shard's
    rows to one shard's DDL, so it stops the stream with the fix instead."""
    _added, widened, problems = _schema_diff(file_schema(target), new_schema)
    dropped = [f.name for f in file_schema(target) if f.name not in new_schema.names]
    if drops or renames or widened or dropped or [p for p in problems if "dropped" not in p]:
        changed = sorted({*(drops or ()), *(renames or {}), *(w[0] for w in widened), *dropped})
        raise UnsupportedSchemaChange(
            f"{table} is routed to {route.target}, shared by every shard, which follows only ADD COLUMN; this "
            f"change of {changed or 'its columns'} is not followed. Apply it to every shard, then route them to a "
            "new target (a new Delta table) and re-snapshot them with resnapshot_tables"
        )


__all__ = ["check_shard_evolution", "check_shard_schema", "file_schema", "routed_schema", "shard_files",
           "stamp_source"]  # fmt: skip
