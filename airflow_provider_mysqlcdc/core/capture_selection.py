"""What a pipeline captures, as its last plan said — carried in the stream manifest.

Why the stream needs it: a table created while the stream runs is captured from its ``CREATE
TABLE`` when the pipeline's ``tables`` / ``exclude_tables`` select it, with the changelog and
metadata-column settings the plan would have given it (docs/architecture.md, "Tables created
while streaming"). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.routing import Routes
from airflow_provider_mysqlcdc.core.table_selection import TableSelection


@dataclass(frozen=True)
class CaptureSelection:
    """What the pipeline captures, as its last plan said: the stream captures a table created while
    it runs (``CREATE TABLE``) when ``tables``/``exclude_tables`` select it (docs/architecture.md,
    "Tables created while streaming")."""

    tables: tuple[str, ...] = ()
    exclude_tables: tuple[str, ...] = ()
    changelog_tables: tuple[str, ...] = ()
    metadata_columns: bool = False
    chunk_key_columns: Mapping[str, list[str]] = field(default_factory=dict)
    routes: tuple[Mapping[str, str], ...] = ()  # core/routing.py: a created shard goes to its route's target

    @property
    def routing(self) -> Routes:
        return Routes.from_list(self.routes)

    def selects(self, table: str) -> bool:
        return bool(self.tables) and TableSelection.parse(list(self.tables), list(self.exclude_tables)).selects(table)

    def has_changelog(self, table: str) -> bool:
        return bool(self.changelog_tables) and TableSelection.parse(list(self.changelog_tables)).selects(table)

    def to_dict(self) -> dict[str, Any]:
        return {"tables": list(self.tables), "exclude_tables": list(self.exclude_tables),
                "changelog_tables": list(self.changelog_tables), "metadata_columns": self.metadata_columns,
                "chunk_key_columns": dict(self.chunk_key_columns),
                "routes": [dict(r) for r in self.routes]}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaptureSelection:
        return cls(tuple(d.get("tables") or ()), tuple(d.get("exclude_tables") or ()),
                   tuple(d.get("changelog_tables") or ()), bool(d.get("metadata_columns", False)),
                   dict(d.get("chunk_key_columns") or {}), tuple(dict(r) for r in d.get("routes") or ()))  # fmt: skip


__all__ = ["CaptureSelection"]
