"""The stream manifest: everything the binlog stream needs from the snapshot, in one JSON document.

The stream is a separate, long-lived Spark application started after the snapshot (DESIGN §3
"Stream handoff"); it cannot see the plan or the chunk results in Airflow's memory, so the handoff
travels as a file in the state store::

    {"version": 1,
     "start_offset": {"file": ..., "pos": ...},          # min HW over every chunk
     "tables": {"db.t": {"schema": TableSchema.to_dict(),
                         "primary_key": [...],             # the sink's merge key
                         "splits": [SnapshotSplit.to_dict() + {"high_watermark": {"file","pos"}}]}},
     "collations": {name: Collation.to_dict()}}            # string chunk keys order like the server

Building it refuses a plan with any chunk lacking a result: a chunk without a HW would make the
filter either drop its changes or (worse) guess. Pure: no I/O, no Airflow, importable by Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from airflow_provider_mysqlcdc.cdc.keys import Collation
from airflow_provider_mysqlcdc.cdc.offset import BinlogOffset
from airflow_provider_mysqlcdc.cdc.split import SnapshotSplit, SplitGroup
from airflow_provider_mysqlcdc.cdc.split_filter import SplitFilter
from airflow_provider_mysqlcdc.source.schema import TableSchema
from airflow_provider_mysqlcdc.state import ChunkResult

MANIFEST_VERSION = 1


class ManifestError(ValueError):
    """The manifest cannot be built or read; the message names what is missing and the fix."""


def _plan_dict(plan: Any) -> dict[str, Any]:
    if isinstance(plan, dict):
        return plan
    to_dict = getattr(plan, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected a SnapshotPlan or its to_dict(), got {type(plan).__name__}")
    return to_dict()


def _format_missing(missing: list[SnapshotSplit], group_of: dict[tuple[str, int], int]) -> str:
    shown = [f"{s.id} (group {group_of[(s.table, s.split_id)]})" for s in missing[:20]]
    more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
    groups = sorted({group_of[(s.table, s.split_id)] for s in missing})
    return f"{', '.join(shown)}{more}; snapshot groups to (re)run: {groups}"


def build_manifest(plan: Any, chunk_results: Iterable[ChunkResult]) -> dict[str, Any]:
    """The manifest for ``plan`` (a ``SnapshotPlan`` or its ``to_dict()``) from its chunk results.

    Every split of the plan needs a result. A split reported twice (a retried group whose first
    attempt also reported) keeps the later HW: offsets only grow, and the retry's write is the one
    the sink holds. Results for splits the plan does not have are ignored (an older plan's).
    """
    pd = _plan_dict(plan)
    tables = {name: TableSchema.from_dict(t) for name, t in pd["tables"].items()}
    groups = [SplitGroup.from_dict(g) for g in pd["groups"]]
    group_of = {(s.table, s.split_id): g.group_id for g in groups for s in g.splits}
    splits_by_table: dict[str, list[SnapshotSplit]] = {t: [] for t in tables}
    for g in groups:
        for s in g.splits:
            if s.table not in splits_by_table:
                raise ManifestError(f"plan has a split {s.id} of table {s.table}, which is not in its tables")
            splits_by_table[s.table].append(s)

    hw: dict[tuple[str, int], BinlogOffset] = {}
    for r in chunk_results:
        k = (r.table, int(r.split_id))
        if k not in group_of:
            continue
        off = BinlogOffset.from_dict(r.high_watermark)
        if k not in hw or off > hw[k]:
            hw[k] = off

    missing = [s for ss in splits_by_table.values() for s in ss if (s.table, s.split_id) not in hw]
    if missing:
        raise ManifestError(
            f"{len(missing)} chunk(s) have no snapshot result, so the stream cannot know from where to apply "
            f"their changes: {_format_missing(missing, group_of)}. Re-run those snapshot groups (clear their "
            "mapped task instances), then build the manifest again"
        )
    empty = [t for t, ss in splits_by_table.items() if not ss]
    if empty:
        raise ManifestError(f"tables {empty} have no chunks in the plan: re-plan them")

    out_tables: dict[str, Any] = {}
    for name, schema in tables.items():
        splits = sorted(splits_by_table[name], key=lambda s: s.split_id)
        out_tables[name] = {
            "schema": schema.to_dict(),
            "primary_key": schema.merge_key(list(splits[0].key_names)),
            "splits": [{**s.to_dict(), "high_watermark": hw[(s.table, s.split_id)].to_dict()} for s in splits],
        }
    return {
        "version": MANIFEST_VERSION,
        "start_offset": min(hw.values()).to_dict(),
        "tables": out_tables,
        "collations": dict(pd.get("collations", {})),
    }


def check_manifest(manifest: Any) -> dict[str, Any]:
    """Raise :class:`ManifestError` unless ``manifest`` has the shape this module writes; return it."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"a stream manifest is a JSON object, got {type(manifest).__name__}")
    version = manifest.get("version")
    if version != MANIFEST_VERSION:
        raise ManifestError(
            f"stream manifest version {version!r} is not supported (expected {MANIFEST_VERSION}): rebuild it "
            "with this provider version (run the stream operator again)"
        )
    for key in ("start_offset", "tables"):
        if key not in manifest:
            raise ManifestError(f"stream manifest lacks {key!r}: rebuild it (run the stream operator again)")
    if not manifest["tables"]:
        raise ManifestError("stream manifest captures no tables: snapshot at least one table first")
    for name, t in manifest["tables"].items():
        for key in ("schema", "primary_key", "splits"):
            if key not in t:
                raise ManifestError(f"stream manifest entry of {name} lacks {key!r}: rebuild the manifest")
        if not t["splits"]:
            raise ManifestError(f"stream manifest has no chunks for {name}: rebuild the manifest")
        for s in t["splits"]:
            if "high_watermark" not in s:
                raise ManifestError(f"chunk {name}#{s.get('split_id')} has no high_watermark: rebuild the manifest")
    return manifest


def manifest_start_offset(manifest: dict[str, Any]) -> BinlogOffset:
    return BinlogOffset.from_dict(manifest["start_offset"])


def split_filter_from_manifest(manifest: dict[str, Any]) -> SplitFilter:
    """The per-chunk HW filter of DESIGN §3 for the manifest's tables."""
    check_manifest(manifest)
    tables = {
        name: [(SnapshotSplit.from_dict(s), BinlogOffset.from_dict(s["high_watermark"])) for s in t["splits"]]
        for name, t in manifest["tables"].items()
    }
    collations = {k: Collation.from_dict(v) for k, v in manifest.get("collations", {}).items()}
    return SplitFilter(tables, collations)


def table_schemas_from_manifest(manifest: dict[str, Any]) -> dict[str, TableSchema]:
    check_manifest(manifest)
    return {name: TableSchema.from_dict(t["schema"]) for name, t in manifest["tables"].items()}


def chunk_key_columns_from_manifest(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """Per table, the columns its chunks are split on — the key the filter locates a change's chunk by.

    This is the primary key unless the plan configured a chunk key, so it is read from the splits
    rather than from ``primary_key``.
    """
    check_manifest(manifest)
    return {name: list(t["splits"][0]["key_columns"]) for name, t in manifest["tables"].items()}


def primary_keys_from_manifest(manifest: dict[str, Any]) -> dict[str, list[str]]:
    check_manifest(manifest)
    return {name: list(t["primary_key"]) for name, t in manifest["tables"].items()}


def manifest_to_json(manifest: dict[str, Any]) -> str:
    return json.dumps(check_manifest(manifest), sort_keys=True)


def manifest_from_json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"the stream manifest is not valid JSON ({exc}): rebuild it") from None
    return check_manifest(data)
