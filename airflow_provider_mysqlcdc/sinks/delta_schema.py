"""Make a Delta table follow a source ``ALTER TABLE``: add columns, widen types, refuse the rest.

Why here and not in the MERGE: a batch after an ALTER carries rows of the new schema, and the MERGE
refuses columns its table lacks rather than drop them silently; the stream follows the DDL first
(docs/architecture.md, "The sink") and only then applies the batch again. A change
the table cannot follow in place raises :class:`UnsupportedSchemaChange` before anything commits,
and the table must be re-snapshotted.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable, Field, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties

from airflow_provider_mysqlcdc.core.row_metadata import METADATA_COLUMNS
from airflow_provider_mysqlcdc.sinks.delta_merge import COMMIT_ATTEMPTS, DELETE_FLAG, delta_arrow_schema

if TYPE_CHECKING:
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink

log = logging.getLogger(__name__)

_INT_BITS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}
_PK_RE = re.compile(r"\(primary key: (.*)\)\s*$")


class UnsupportedSchemaChange(ValueError):
    """A source schema change the Delta table cannot follow in place: the table must be re-snapshotted.

    Raised before anything is committed; the message names the table, each offending column and
    what happened to it (narrowed, changed type family, dropped, primary key changed).
    """


@dataclass(frozen=True)
class SchemaEvolution:
    """What :meth:`DeltaSink.evolve_schema` did: columns added, types widened, whether it rewrote."""

    table: str
    added: tuple[str, ...] = ()
    widened: tuple[tuple[str, str, str], ...] = ()  # (column, old arrow type, new arrow type)
    rewritten: bool = False  # True: every data file was rewritten (cost ~ the table's size)
    version: int | None = None  # the Delta version of the change; None when nothing changed
    dropped: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()  # (old name, new name)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened or self.dropped or self.renamed)


def table_description(table: str, primary_key: Sequence[str]) -> str:
    """The Delta table's description; it records the primary key so a changed key is detected later."""
    return f"CDC copy of {table} (primary key: {', '.join(primary_key)})"


def evolve_table_schema(
    sink: DeltaSink,
    table: str,
    new_schema: pa.Schema,
    primary_key: Sequence[str] | None = None,
    *,
    drop_columns: Sequence[str] = (),
    rename_columns: Mapping[str, str] | None = None,
    before_commit: Callable[[], None] | None = None,
) -> SchemaEvolution:
    """Make the Delta table of ``table`` follow a source ``ALTER TABLE``; idempotent.

    ``new_schema`` is the canonical Arrow schema of the altered source table
    (:func:`~airflow_provider_mysqlcdc.core.types.arrow_schema`). Supported, in place:

    * **added columns** — appended as nullable columns; rows written before read NULL.
      Without a widening this is ``dt.alter.add_columns``: one metadata-only commit, O(1).
    * **widened types** (Delta's type-widening rules): a wider integer, integer -> float64
      (from at most int32), integer -> decimal with enough integer digits, float32 -> float64,
      decimal(p,s) -> decimal(p',s') with s' >= s and p'-s' >= p-s. A VARCHAR/CHAR/TEXT length
      change is no change at all (every string is ``string``). delta-rs 1.6.6 has no
      ``typeWidening`` table feature, and a metadata-only type change would leave Parquet files
      whose physical type differs from the table's, which other Delta readers reject. So a
      widening **rewrites the whole table** in one commit (``write_deltalake(mode="overwrite",
      schema_mode="overwrite", predicate="true")``, fed by a streaming DataFusion scan, so memory
      stays bounded by a batch): it costs one full read and write of the table, and added
      columns ride along in the same commit. Batch ids recorded by :meth:`DeltaSink.apply_changes` survive
      the rewrite (transaction identifiers are log state, not file state). The ``predicate``
      makes delta-rs treat the rewrite as a read of the whole table, so a concurrent append
      conflicts (and the rewrite is retried) instead of surviving with the old physical type.

    * **dropped and renamed columns**, only those named in ``drop_columns`` / ``rename_columns``
      (old -> new; the schema-change policy ``evolve`` asks for them, core/schema_policy.py): the
      same whole-table rewrite, since delta-rs cannot drop or rename a column without column mapping.

    Anything else — a narrowing, a type family change (e.g. INT -> VARCHAR, DECIMAL(40,..) ->
    text), a dropped or renamed column, a changed primary key (``primary_key`` is compared with
    the key :meth:`DeltaSink.prepare_table` recorded) — raises :class:`UnsupportedSchemaChange` naming the
    columns, and the table must be re-snapshotted. Nothing is committed in that case.

    ``before_commit`` runs after the table was read and before the change commits (a test seam
    like ``apply_changes``' ``before_merge``). Not for production use.
    """
    for attempt in range(COMMIT_ATTEMPTS):
        dt = sink.open(table)
        sink.check_owner(table, dt)
        current = delta_arrow_schema(dt)
        # idempotent: a rename or drop the table already has is not done again
        renames = {a: b for a, b in (rename_columns or {}).items() if a in current.names and b not in current.names}
        drops = [c for c in drop_columns if c in current.names]
        view = pa.schema([f.with_name(renames.get(f.name, f.name)) for f in current if f.name not in drops])
        added, widened, problems = _schema_diff(view, new_schema)
        if primary_key is not None:
            problems.extend(_primary_key_problems(dt, list(primary_key)))
        if problems:
            raise UnsupportedSchemaChange(
                f"{table}: the source schema changed in a way the Delta table cannot follow in place: "
                + "; ".join(problems)
                + f". Re-snapshot {table} (backfill it from the DAG's trigger form) to rebuild its Delta table"
            )
        if not added and not widened and not renames and not drops:
            return SchemaEvolution(table)
        new_fields = [pa.field(name, new_schema.field(name).type, nullable=True) for name in added]
        commit = CommitProperties(custom_metadata={"mysqlcdc": json.dumps({
            "schema_change": {"added": added, "widened": [[n, str(a), str(b)] for n, a, b in widened],
                              "dropped": drops, "renamed": renames},
        })})  # fmt: skip
        if before_commit is not None:
            before_commit()
        try:
            if not widened and not renames and not drops:
                dt.alter.add_columns([Field.from_arrow(f) for f in new_fields], commit_properties=commit)
                log.info("%s: added columns %s (metadata-only commit, version %s)", table, added, dt.version())
                return SchemaEvolution(table, tuple(added), (), False, dt.version())
            version = _rewrite_with_schema(dt, current, widened, new_fields, commit, renames, drops)
        except CommitFailedError as exc:
            log.info("%s: schema change conflicted with a concurrent commit (%s); retrying",
                     table, str(exc).splitlines()[0])  # fmt: skip
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        changes = tuple((n, str(a), str(b)) for n, a, b in widened)
        log.info("%s: widened %s, added %s, dropped %s, renamed %s by rewriting the table (version %s)",
                 table, changes, added, drops, renames, version)  # fmt: skip
        return SchemaEvolution(table, tuple(added), changes, True, version, tuple(drops), tuple(renames.items()))
    raise RuntimeError(f"could not change the schema of {table}: {COMMIT_ATTEMPTS} attempts conflicted")


def _rewrite_with_schema(
    dt: DeltaTable,
    current: pa.Schema,
    widened: list[tuple[str, pa.DataType, pa.DataType]],
    new_fields: list[pa.Field],
    commit: CommitProperties,
    renames: Mapping[str, str] | None = None,
    drops: Sequence[str] = (),
) -> int:
    """Rewrite every row of ``dt`` with the widened schema (plus new NULL columns, minus dropped
    ones, renamed ones under their new names) in one commit."""
    renames = renames or {}
    wider = {name: new for name, _, new in widened}
    kept = [f for f in current if f.name not in drops]
    source = {renames.get(f.name, f.name): f.name for f in kept}
    final = pa.schema(
        [pa.field(renames.get(f.name, f.name), wider.get(renames.get(f.name, f.name), f.type), nullable=True)
         for f in kept] + new_fields
    )  # fmt: skip
    # A DataFusion scan of the snapshot that ``dt`` holds; consumed batch by batch by the writer.
    scan = pa.RecordBatchReader.from_stream(QueryBuilder().register("t", dt).execute("SELECT * FROM t"))

    def widened_batches() -> Iterator[pa.RecordBatch]:
        for batch in scan:
            names = batch.schema.names
            columns = [
                batch.column(source[f.name]).cast(f.type) if source.get(f.name) in names
                else pa.nulls(batch.num_rows, f.type)
                for f in final
            ]  # fmt: skip
            yield pa.RecordBatch.from_arrays(columns, schema=final)

    write_deltalake(
        dt,
        pa.RecordBatchReader.from_batches(final, widened_batches()),
        mode="overwrite",
        schema_mode="overwrite",
        predicate="true",
        commit_properties=commit,
    )
    return dt.version()


def _normalized(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def column_signature(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """Names and types, string and binary kinds folded: what makes two table schemas the same."""
    return [(f.name, _normalized(f.type)) for f in schema]


def _is_widening(old: pa.DataType, new: pa.DataType) -> bool:
    """Delta's type-widening rules (the ones Delta 4 lets a table change without a rewrite)."""
    if old in _INT_BITS and new in _INT_BITS:
        return _INT_BITS[new] > _INT_BITS[old]
    if old in _INT_BITS and pa.types.is_float64(new):
        return _INT_BITS[old] <= 32  # every int32 is exact in a double; an int64 is not
    if old in _INT_BITS and pa.types.is_decimal(new):
        return new.precision - new.scale >= (20 if _INT_BITS[old] == 64 else 10)
    if pa.types.is_float32(old) and pa.types.is_float64(new):
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale and new != old
    return False


def _schema_diff(
    current: pa.Schema, new: pa.Schema
) -> tuple[list[str], list[tuple[str, pa.DataType, pa.DataType]], list[str]]:
    """``(added columns, widened columns, problems)`` going from the table's schema to ``new``."""
    added: list[str] = []
    widened: list[tuple[str, pa.DataType, pa.DataType]] = []
    problems: list[str] = []
    for f in new:
        if f.name == DELETE_FLAG:
            problems.append(f"column {f.name} is reserved by the sink")
        elif f.name not in current.names:
            added.append(f.name)
    for f in current:
        if f.name not in new.names and f.name in METADATA_COLUMNS:
            continue  # the sink's own columns (metadata_columns), not the source's
        if f.name not in new.names:
            problems.append(
                f"column {f.name!r} was dropped or renamed, and this change does not name it to drop or rename "
                "(the stream's schema_change_policy decides: evolve drops or renames it, lenient keeps it)"
            )
            continue
        old_t, new_t = _normalized(f.type), _normalized(new.field(f.name).type)
        if old_t == new_t:
            continue
        if _is_widening(old_t, new_t):
            widened.append((f.name, old_t, new_t))
        elif _is_widening(new_t, old_t):
            problems.append(f"column {f.name!r} was narrowed from {old_t} to {new_t}")
        else:
            problems.append(f"column {f.name!r} changed type from {old_t} to {new_t}, which is not a widening")
    return added, widened, problems


def _primary_key_problems(dt: DeltaTable, primary_key: list[str]) -> list[str]:
    """A changed primary key: compared with the key :func:`table_description` wrote down."""
    m = _PK_RE.search(dt.metadata().description or "")
    if m is None:
        return []
    recorded = [c.strip() for c in m.group(1).split(",") if c.strip()]
    if recorded != primary_key:
        return [f"the primary key changed from ({', '.join(recorded)}) to ({', '.join(primary_key)})"]
    return []


__all__ = ["SchemaEvolution", "UnsupportedSchemaChange", "column_signature", "evolve_table_schema", "table_description"]
