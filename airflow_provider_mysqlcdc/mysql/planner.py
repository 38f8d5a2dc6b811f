"""Plan a snapshot: check tables, split each into chunks, pack chunks into chunk groups."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.chunk import DEFAULT_MAX_MAP_LENGTH, ChunkGroup, SnapshotChunk, group_splits
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.table import TableId, TableSchema
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema, read_table_schemas
from airflow_provider_mysqlcdc.mysql.splitter import SplitOptions, TableSplitResult, split_table

log = logging.getLogger(__name__)

DEFAULT_CHUNKS_PER_GROUP = 64


@dataclass
class SnapshotPlan:
    tables: dict[str, TableSchema]
    splits: list[SnapshotChunk]
    groups: list[ChunkGroup]
    collations: dict[str, Collation] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tables": {k: v.to_dict() for k, v in self.tables.items()},
            "groups": [g.to_dict() for g in self.groups],
            "collations": {k: v.to_dict() for k, v in self.collations.items()},
            "methods": dict(self.methods),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SnapshotPlan:
        groups = [ChunkGroup.from_dict(g) for g in d["groups"]]
        return cls(
            tables={k: TableSchema.from_dict(v) for k, v in d["tables"].items()},
            splits=[s for g in groups for s in g.splits],
            groups=groups,
            collations={k: Collation.from_dict(v) for k, v in d.get("collations", {}).items()},
            methods=dict(d.get("methods", {})),
        )


def plan_snapshot(
    conn: Any,
    tables: list[str],
    chunk_size: int,
    chunks_per_group: int = DEFAULT_CHUNKS_PER_GROUP,
    chunk_key_columns: dict[str, list[str]] | None = None,
    max_groups: int = DEFAULT_MAX_MAP_LENGTH,
) -> SnapshotPlan:
    if not tables:
        raise ValueError("no tables to plan: pass at least one <database>.<table>")
    ck = {str(TableId.parse(k)): v for k, v in (chunk_key_columns or {}).items()}
    cache: dict[str, Collation] = {}
    results: list[TableSplitResult] = []
    ids = list(dict.fromkeys(TableId.parse(t) for t in tables))
    known = read_table_schemas(conn, ids)
    for tid in ids:
        schema = known.get(tid) or read_table_schema(conn, tid)  # the latter says what is wrong
        results.append(split_table(conn, schema, SplitOptions(chunk_size, ck.get(str(tid))), cache))
    splits = [s for r in results for s in r.splits]
    groups = group_splits(splits, chunks_per_group, max_groups)
    log.info("planned %d chunks of %d table(s) in %d chunk group(s)", len(splits), len(results), len(groups))
    return SnapshotPlan(
        tables={str(r.schema.table): r.schema for r in results},
        splits=splits,
        groups=groups,
        collations={k: v for r in results for k, v in r.collations.items()},
        methods={str(r.schema.table): r.method for r in results},
    )


def with_repaired_chunks(
    base: SnapshotPlan | None,
    captured: dict[str, Any],
    repairs: dict[str, list[int]],
    collations: dict[str, Collation],
    chunks_per_group: int,
    max_groups: int = DEFAULT_MAX_MAP_LENGTH,
) -> SnapshotPlan:
    """``base`` plus the chunks ``repairs`` names of captured tables, as they are in the manifest
    (``captured``: table -> CapturedTable), all packed into groups again. A repaired chunk keeps its
    key range and split id, so its new HW replaces the old one chunk for chunk."""
    splits = list(base.splits) if base else []
    tables = dict(base.tables) if base else {}
    for table, ids in repairs.items():
        entry = captured[table]
        by_id = {c.chunk.split_id: c.chunk for c in entry.chunks}
        unknown = sorted(set(ids) - set(by_id))
        if unknown:
            raise ValueError(f"{table} has no chunk(s) {unknown}: its chunks are 0..{len(by_id) - 1}, as verify "
                             "numbers them")  # fmt: skip
        splits += [by_id[i] for i in sorted(set(ids))]
        tables[table] = entry.schema
    groups = group_splits(splits, chunks_per_group, max_groups)
    log.info("repair: %s; %d chunks in %d chunk group(s)", repairs, len(splits), len(groups))
    return SnapshotPlan(
        tables=tables,
        splits=splits,
        groups=groups,
        collations={**collations, **(base.collations if base else {})},
        methods={**(base.methods if base else {}), **dict.fromkeys(repairs, "repair")},
    )
