"""The schema-change policy: what the stream does with each DDL of a captured table.

Flink CDC's EVOLVE / LENIENT / EXCEPTION are the model (docs/architecture.md, "Schema changes"):

* ``evolve``  — the lake follows the source: columns added, widened, dropped and renamed in the
  Delta table; a TRUNCATE empties it; a dropped or renamed-away table is emptied and no longer
  captured.
* ``lenient`` (default) — the lake never loses what it holds: columns added and widened; a dropped
  column is kept and reads NULL in rows written from then on; a renamed column is added under its
  new name and the old one kept (NULL from then on); TRUNCATE is ignored; a dropped or
  renamed-away table keeps its Delta table and is no longer captured.
* ``fail`` — any DDL that changes a captured table's columns or rows stops the stream before it,
  with a message naming the table, the statement and the fix.

Whatever the policy, nothing is lost: the stream stops *before* the DDL's micro-batch is applied,
the decision is recorded in the manifest, and the batch is applied again under it. A change no
policy can follow in place (a changed primary key, a narrowed or re-typed column) stops the stream
and names a re-snapshot. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableSchema

EVOLVE = "evolve"
LENIENT = "lenient"
FAIL = "fail"
SCHEMA_CHANGE_POLICIES = (EVOLVE, LENIENT, FAIL)
DEFAULT_SCHEMA_CHANGE_POLICY = LENIENT


def check_policy(policy: str) -> str:
    if policy not in SCHEMA_CHANGE_POLICIES:
        raise ValueError(f"schema_change_policy {policy!r} is not one of {', '.join(SCHEMA_CHANGE_POLICIES)}")
    return policy


@dataclass(frozen=True)
class ColumnDiff:
    """How an ALTER changed a table's columns (names compared as MySQL does: case-insensitively)."""

    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    renamed: Mapping[str, str] = field(default_factory=dict)  # old -> new
    modified: tuple[str, ...] = ()  # type or nullability changed (a widening or not: the sink judges)
    key_changed: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.dropped or self.renamed or self.modified or self.key_changed)

    def describe(self) -> str:
        parts = []
        for what, names in (("added", self.added), ("dropped", self.dropped), ("modified", self.modified)):
            if names:
                parts.append(f"{what} {', '.join(names)}")
        if self.renamed:
            parts.append("renamed " + ", ".join(f"{a} to {b}" for a, b in self.renamed.items()))
        if self.key_changed:
            parts.append("primary key changed")
        return "; ".join(parts) or "no column changed"


def column_diff(old: TableSchema, new: TableSchema, renames: Mapping[str, str] | None = None) -> ColumnDiff:
    """The difference between the columns the stream knew and the table's columns after an ALTER.

    ``renames`` (``core/ddl.column_renames`` of the statements) tells a renamed column from a
    dropped one plus an added one."""
    old_by = {c.name.lower(): c for c in old.columns}
    new_by = {c.name.lower(): c for c in new.columns}
    renamed = {
        old_by[a.lower()].name: new_by[b.lower()].name
        for a, b in (renames or {}).items()
        if a.lower() in old_by and b.lower() in new_by and a.lower() not in new_by and b.lower() not in old_by
    }
    gone = {a.lower() for a in renamed}
    came = {b.lower() for b in renamed.values()}
    added = tuple(c.name for c in new.columns if c.name.lower() not in old_by and c.name.lower() not in came)
    dropped = tuple(c.name for c in old.columns if c.name.lower() not in new_by and c.name.lower() not in gone)
    modified = []
    for c in old.columns:
        n = new_by.get(c.name.lower()) or new_by.get(renamed.get(c.name, "").lower())
        if n is not None and _definition(c) != _definition(n):
            modified.append(n.name)
    key_changed = [k.lower() for k in old.primary_key] != [k.lower() for k in new.primary_key]
    return ColumnDiff(added, dropped, renamed, tuple(modified), key_changed)


def _definition(c: ColumnInfo) -> tuple[str, bool]:
    return c.column_type.lower(), c.nullable


@dataclass(frozen=True)
class SchemaAction:
    """What to do with one DDL of one table (see the module doc)."""

    stop: str | None = None  # the stream stops with this message
    drop_columns: tuple[str, ...] = ()  # evolve: removed from the Delta table
    rename_columns: Mapping[str, str] = field(default_factory=dict)  # evolve: renamed in the Delta table
    retire_columns: tuple[str, ...] = ()  # lenient: kept in the Delta table, NULL in rows written from now on
    empty: bool = False  # evolve: the Delta table is emptied at the DDL (rows after it still apply)
    end: bool = False  # the table is no longer captured after the DDL
    note: str = ""  # what was done, for the log and the stream status


def _fix(table: str) -> str:
    return (
        f"Fix: trigger the DAG with schema_change_policy='lenient' (keep what the lake holds) or 'evolve' (follow the "
        f"source) so the stream passes it, or with resnapshot_tables=['{table}']. The stream stopped before it; "
        "nothing after it was applied"
    )


def decide_alter(table: str, diff: ColumnDiff, policy: str, statement: str) -> SchemaAction:
    """The action for an ALTER of ``table`` whose effect is ``diff``; ``statement`` names it in messages."""
    if diff.key_changed:
        return SchemaAction(
            stop=f"{statement}: the primary key of {table} changed, and rows are merged by that key; no policy can "
            f"follow it in place. Re-snapshot {table}: trigger the DAG with resnapshot_tables=['{table}']"
        )
    if not diff.changed:
        return SchemaAction(note="no column changed")
    if policy == FAIL:
        return SchemaAction(stop=f"{statement} ({diff.describe()}) and schema_change_policy is 'fail'. {_fix(table)}")
    if policy == EVOLVE:
        return SchemaAction(drop_columns=diff.dropped, rename_columns=dict(diff.renamed), note=_note(diff, policy))
    kept = tuple(diff.dropped) + tuple(diff.renamed)
    return SchemaAction(retire_columns=kept, note=_note(diff, policy))


def _note(diff: ColumnDiff, policy: str) -> str:
    """What was done, saying where: "dropped weight_g; kept weight_g" read as a contradiction."""
    parts = [f"{what} {', '.join(names)}" for what, names in (("added", diff.added), ("modified", diff.modified))
             if names]  # fmt: skip
    if policy == EVOLVE:
        if diff.dropped:
            parts.append(f"{', '.join(diff.dropped)} dropped at the source and in the lake (evolve)")
        parts += [f"{a} renamed to {b} at the source and in the lake (evolve)" for a, b in diff.renamed.items()]
        return "; ".join(parts)
    if diff.dropped:
        parts.append(f"{', '.join(diff.dropped)} dropped at the source; kept in the lake (lenient: NULL from now on)")
    parts += [f"{a} renamed to {b} at the source; {b} added in the lake, {a} kept (lenient: NULL from now on)"
              for a, b in diff.renamed.items()]  # fmt: skip
    return "; ".join(parts)


def decide_table_ddl(table: str, kind: str, policy: str, statement: str, swap: bool = False) -> SchemaAction:
    """The action for a TRUNCATE, DROP, RENAME or CREATE OR REPLACE of ``table``, or the CREATE of a
    table the pipeline's selection captures (``fail`` stops on that too: it is a schema change).

    ``swap``: a RENAME that also renames another table in under ``table``'s name (an online schema
    change tool's cut-over): the table lives on with the same rows, so even ``evolve`` keeps the Delta
    table; capture of the old table ends and the next DAG run snapshots the new one."""
    if policy == FAIL:
        return SchemaAction(stop=f"{statement} and schema_change_policy is 'fail'. {_fix(table)}")
    if kind == "create":
        return SchemaAction(note="captured from its CREATE")
    if kind == "truncate":
        if policy == EVOLVE:
            return SchemaAction(empty=True, note="emptied")
        return SchemaAction(note="ignored: the Delta table keeps its rows")
    later = "the next DAG run snapshots it again if it is still selected"
    if swap:
        return SchemaAction(end=True, note=f"replaced by a renamed-in table (online schema change); {later}")
    if policy == EVOLVE:
        return SchemaAction(empty=True, end=True, note=f"emptied and no longer captured; {later}")
    return SchemaAction(end=True, note=f"no longer captured, the Delta table keeps its rows; {later}")


__all__ = [
    "DEFAULT_SCHEMA_CHANGE_POLICY",
    "EVOLVE",
    "FAIL",
    "LENIENT",
    "SCHEMA_CHANGE_POLICIES",
    "ColumnDiff",
    "SchemaAction",
    "check_policy",
    "column_diff",
    "decide_alter",
    "decide_table_ddl",
]
