"""Building the stream manifest: from a snapshot plan and its chunk results, for a partial
backfill's chunks, and for a table captured from an offset with no snapshot.

Why it refuses a plan with a chunk lacking a result: a chunk without a HW would make the handoff
filter either drop its changes or (worse) guess (docs/architecture.md, "The handoff"). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_provider_mysqlcdc.core.chunk import ChunkGroup, SnapshotChunk
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, FinishedChunk, Manifest, ManifestError
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.records import ChunkResult
from airflow_provider_mysqlcdc.core.table import TableSchema


def _plan_dict(plan: Any) -> dict[str, Any]:
    if isinstance(plan, dict):
        return plan
    to_dict = getattr(plan, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected a SnapshotPlan or its to_dict(), got {type(plan).__name__}")
    return to_dict()


def _format_missing(missing: list[SnapshotChunk], group_of: dict[tuple[str, int], int]) -> str:
    shown = [f"{s.id} (group {group_of[(s.table, s.split_id)]})" for s in missing[:20]]
    more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
    groups = sorted({group_of[(s.table, s.split_id)] for s in missing})
    return f"{', '.join(shown)}{more}; snapshot groups to (re)run: {groups}"


def build_manifest(plan: Any, chunk_results: Iterable[ChunkResult]) -> Manifest:
    """The manifest for ``plan`` (a ``SnapshotPlan`` or its ``to_dict()``) from its chunk results.

    Every chunk of the plan needs a result. A chunk reported twice (a retried group whose first
    attempt also reported) keeps the later HW: offsets only grow, and the retry's write is the one
    the sink holds. Results for chunks the plan does not have are ignored (an older plan's).
    """
    pd = _plan_dict(plan)
    schemas = {name: TableSchema.from_dict(t) for name, t in pd["tables"].items()}
    groups = [ChunkGroup.from_dict(g) for g in pd["groups"]]
    group_of = {(s.table, s.split_id): g.group_id for g in groups for s in g.splits}
    chunks_by_table: dict[str, list[SnapshotChunk]] = {t: [] for t in schemas}
    for g in groups:
        for s in g.splits:
            if s.table not in chunks_by_table:
                raise ManifestError(f"plan has a chunk {s.id} of table {s.table}, which is not in its tables")
            chunks_by_table[s.table].append(s)

    hw: dict[tuple[str, int], BinlogOffset] = {}
    for r in chunk_results:
        k = (r.table, int(r.split_id))
        if k in group_of and (k not in hw or r.high_watermark > hw[k]):
            hw[k] = r.high_watermark

    missing = [s for ss in chunks_by_table.values() for s in ss if (s.table, s.split_id) not in hw]
    if missing:
        raise ManifestError(
            f"{len(missing)} chunk(s) have no snapshot result, so the stream cannot know from where to apply "
            f"their changes: {_format_missing(missing, group_of)}. Re-run those snapshot groups (clear their "
            "mapped task instances), then build the manifest again"
        )
    empty = [t for t, ss in chunks_by_table.items() if not ss]
    if empty:
        raise ManifestError(f"tables {empty} have no chunks in the plan: re-plan them")
    tables = {}
    for name, schema in schemas.items():
        chunks = sorted(chunks_by_table[name], key=lambda s: s.split_id)
        finished = [FinishedChunk(s, hw[(s.table, s.split_id)]) for s in chunks]
        tables[name] = CapturedTable(schema, schema.merge_key(list(chunks[0].key_names)), finished)
    collations = {k: Collation.from_dict(v) for k, v in pd.get("collations", {}).items()}
    return Manifest.of(tables, collations)


def partial_backfill_chunks(
    fresh: Iterable[FinishedChunk], before: Iterable[FinishedChunk], restart: BinlogOffset | None
) -> list[FinishedChunk]:
    """The HWs of chunks a partial backfill (``snapshot_filters``) read again: min(new HW, R), R =
    where the stream resumes (its checkpoint), else the chunk's old HW (no batch ran yet).

    Why not the new HW, as a repair gives: the backfill replaced only the rows its filter selected.
    The chunk's other rows are in the lake as of R, so the stream must apply their changes from R
    on — a chunk HW after R would drop those between R and it. Replaying from the earlier offset
    over the fresh rows, which are as of the new HW, passes through older images of them and ends
    at the source's state: every change after the offset is applied in order, and a row image
    replaces the whole row (docs/architecture.md, "Partial backfill")."""
    old = {c.chunk.split_id: c.high_watermark for c in before}
    out = []
    for c in fresh:
        bound = restart if restart is not None else old.get(c.chunk.split_id, c.high_watermark)
        out.append(FinishedChunk(c.chunk, min(c.high_watermark, bound)))
    return out


def offset_table(schema: TableSchema, key_columns: list[dict[str, Any]], offset: BinlogOffset) -> CapturedTable:
    """A table captured from ``offset`` with no snapshot: one unbounded chunk that passes from there.

    ``key_columns`` are ``KeyColumn.to_dict()`` values (name, kind, collation).
    """
    from airflow_provider_mysqlcdc.core.keys import KeyColumn

    chunk = SnapshotChunk(str(schema.table), 0, tuple(KeyColumn.from_dict(k) for k in key_columns), None, None)
    return CapturedTable(schema, schema.merge_key([k["name"] for k in key_columns]), [FinishedChunk(chunk, offset)])


__all__ = ["build_manifest", "offset_table", "partial_backfill_chunks"]
