"""Routing sharded source tables into one Delta table (Flink CDC ``route``, Paimon ``--merge_shards``).

Why: a sharded application writes one logical table as ``db_0.orders_0`` … ``db_3.orders_1``;
users want one lake table holding every shard's rows. A route maps every selected table its
pattern matches to a target ``database.table``. Each shard stays a captured table of its own
(its chunks, watermarks and handoff are unchanged); only its Delta table is shared. The target
gains :data:`SOURCE_COLUMNS` — ``_source_database`` and ``_source_table`` — which join the primary
key, so one key in two shards is two rows (docs/architecture.md, "Routing sharded tables").

In the Delta table the two columns are partition columns: a shard's rows are the files of its
partition, so every write of a shard (snapshot commit, MERGE, rewrite, swap) is scoped to files
no other shard touches, and staged snapshot files need no extra columns. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.core.table_selection import TablePattern

SOURCE_DATABASE = "_source_database"
SOURCE_TABLE = "_source_table"
#: The columns a routed table gains; partition columns of its Delta table, first in its key.
SOURCE_COLUMNS = (SOURCE_DATABASE, SOURCE_TABLE)


@dataclass(frozen=True)
class TableRoute:
    """One rule: tables whose ``database.table`` matches ``source`` go to the Delta table ``target``."""

    source: str
    target: str

    def matches(self, table: str) -> bool:
        return TablePattern.parse(self.source).matches(table)

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "target": self.target}


@dataclass(frozen=True)
class RoutedTable:
    """Where one source table's rows go: the target Delta table, in the partition of its name."""

    source: str  # database.table
    target: str  # database.table of the shared Delta table

    @property
    def partition_values(self) -> dict[str, str]:
        tid = TableId.parse(self.source)
        return {SOURCE_DATABASE: tid.database, SOURCE_TABLE: tid.table}

    def app_id(self, app_id: str) -> str:
        """The Delta transaction app id of this shard's stream commits: every shard of one batch
        records its own batch id in the shared table, so a replay skips exactly the shards done."""
        return f"{app_id}@{self.source}"

    def predicate(self) -> str:
        """This shard's rows, as a delta-rs SQL predicate."""
        return " AND ".join(f"`{c}` = '{v.replace(chr(39), chr(39) * 2)}'" for c, v in self.partition_values.items())

    def merge_key(self, key: Sequence[str]) -> list[str]:
        return [*SOURCE_COLUMNS, *key]


@dataclass(frozen=True)
class Routes:
    """The pipeline's routes, first match wins."""

    rules: tuple[TableRoute, ...] = ()

    def route_of(self, table: str) -> RoutedTable | None:
        for r in self.rules:
            if r.matches(table):
                return RoutedTable(table, r.target)
        return None

    def targets(self) -> list[str]:
        return sorted({r.target for r in self.rules})

    def to_list(self) -> list[dict[str, str]]:
        return [r.to_dict() for r in self.rules]

    @classmethod
    def from_list(cls, items: Sequence[Mapping[str, str]] | None) -> Routes:
        return cls(tuple(TableRoute(str(i["source"]), str(i["target"])) for i in items or ()))

    @classmethod
    def parse(cls, value: Any, problems: list[str]) -> Routes:
        """Validate the ``routes`` parameter: a list of ``{"source": pattern, "target": "db.table"}``
        (or its JSON text); each problem is appended to ``problems`` with the fix."""
        if value in (None, "", [], {}):
            return cls()
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                problems.append(f"routes must be a JSON list like {_EXAMPLE}, got {value!r}")
                return cls()
        if not isinstance(value, list):
            problems.append(f"routes must be a list like {_EXAMPLE}, got {value!r}")
            return cls()
        rules: list[TableRoute] = []
        for item in value:
            if not isinstance(item, Mapping) or set(item) != {"source", "target"}:
                problems.append(f"routes: {item!r} must have exactly the keys source and target, e.g. {_EXAMPLE}")
                continue
            try:
                TablePattern.parse(item["source"])
                target = TablePattern.parse(item["target"])
            except ValueError as exc:
                problems.append(f"routes: {exc}")
                continue
            if target.kind != "exact":
                problems.append(f"routes: target {item['target']!r} must be one <database>.<table>, not a pattern")
                continue
            rules.append(TableRoute(str(item["source"]).strip(), target.text))
        return cls(tuple(rules))


_EXAMPLE = '[{"source": "db_[0-9]+\\\\.orders_[0-9]+", "target": "shop.orders"}]'


def incompatible_shards(target: str, shards: Mapping[str, tuple[Mapping[str, str], Sequence[str]]]) -> str | None:
    """Why the shards routed to ``target`` cannot share one Delta table, or None.

    ``shards`` maps each source table to ``({column: lake type}, key columns)``. A column they share
    must have one lake type, and the key must be the same: one Delta table has one type per column
    and one key. A column only some shards have is fine — it reads NULL in the others' rows, as
    while an ``ADD COLUMN`` rolls through the shards. The message names each differing column with
    its type per shard, and the fix.
    """
    if len(shards) < 2:
        return None
    names = sorted(shards)
    first = names[0]
    cols0, key0 = shards[first]
    diffs: list[str] = []
    for other in names[1:]:
        cols, key = shards[other]
        for c in sorted(set(cols0) | set(cols)):
            a, b = cols0.get(c), cols.get(c)
            if a is not None and b is not None and a != b:
                diffs.append(f"{c}: {a} in {first}, {b} in {other}")
        if list(key) != list(key0):
            diffs.append(f"primary key: {list(key0)} in {first}, {list(key)} in {other}")
    if not diffs:
        return None
    return (
        f"routes: the tables routed to {target} differ, and one Delta table holds rows of one schema — "
        + "; ".join(diffs[:20]) + ("; …" if len(diffs) > 20 else "")
        + ". Give every shard the same column types and key (ALTER TABLE), or route the differing ones to another "
        "target"
    )


__all__ = ["SOURCE_COLUMNS", "SOURCE_DATABASE", "SOURCE_TABLE", "RoutedTable", "Routes", "TableRoute",
           "incompatible_shards"]  # fmt: skip
