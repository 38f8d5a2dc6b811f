"""The stream manifest: everything the binlog stream needs from the snapshot — the handoff contract.

The stream is a separate, long-lived Spark application started after the snapshot; it cannot see
the plan or the chunk results in Airflow's memory, so the handoff travels as a typed record, stored
as one JSON document in the state store (docs/architecture.md, "The handoff")::

    Manifest
      start_offset      BinlogOffset: the minimum high watermark over every chunk
      generation        Generation: number, checkpoint directory, Delta transaction app id
      collations        how string chunk keys order on the server
      tables            db.table -> CapturedTable
        schema          TableSchema as the stream decodes it
        merge_key       the columns the sink merges rows by (primary key, else the chunk key)
        chunks          FinishedChunk: a chunk's key range and its high watermark
        added_columns   columns the stream added (ALTER ... ADD): absent in images written before
        added_defaults  the value such a column has in rows older than its ADD (its DEFAULT), if not NULL
        schema_position the last DDL of the table the stream followed
        retired_columns columns the source dropped or renamed that the lake keeps (policy lenient)
        renamed_columns old -> new names of columns the lake renamed (policy evolve)
        emptied_at      offsets of DDL at which the lake table was emptied (TRUNCATE/DROP, evolve)
        ended_at        the DROP/RENAME at which capture of the table ended
        shadow_of       the captured table this one is a gh-ost / pt-osc shadow copy of
        replaced_from   cut-overs: offsets where the table continued from its shadow's rows

This module is the only place the JSON keys appear; merging new tables in, starting a generation
and following a DDL are methods here. Building one from a snapshot plan and its chunk results is
:mod:`~airflow_provider_mysqlcdc.core.manifest_build`. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_mysqlcdc.core.canonical_json import from_json, to_json
from airflow_provider_mysqlcdc.core.capture_selection import CaptureSelection
from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.handoff import HandoffFilter
from airflow_provider_mysqlcdc.core.keys import Collation
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableSchema

MANIFEST_VERSION = 1
DEFAULT_CHECKPOINT = "checkpoint"


class ManifestError(ValueError):
    """The manifest cannot be built or read; the message names what is missing and the fix."""


@dataclass(frozen=True)
class FinishedChunk:
    """A snapshotted chunk: its key range and the offset from which the stream applies its changes."""

    chunk: SnapshotChunk
    high_watermark: BinlogOffset

    def to_dict(self) -> dict[str, Any]:
        return {**self.chunk.to_dict(), "high_watermark": self.high_watermark.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any], table: str) -> FinishedChunk:
        if "high_watermark" not in d:
            raise ManifestError(f"chunk {table}#{d.get('split_id')} has no high_watermark: rebuild the manifest")
        return cls(SnapshotChunk.from_dict(d), BinlogOffset.from_dict(d["high_watermark"]))


@dataclass
class CapturedTable:
    """One captured table as the stream sees it (see the module doc)."""

    schema: TableSchema
    merge_key: list[str]
    chunks: list[FinishedChunk]
    added_columns: list[str] = field(default_factory=list)
    schema_position: BinlogOffset | None = None
    changelog: bool = False  # the stream appends its changes to the table's changelog too
    metadata_columns: bool = False  # the mirror's rows carry _op, _commit_ts, _binlog_file, _binlog_pos
    # schema-change policy decisions (core/schema_policy.py), recorded so a replayed batch repeats them
    retired_columns: list[str] = field(default_factory=list)
    renamed_columns: dict[str, str] = field(default_factory=dict)
    emptied_at: list[BinlogOffset] = field(default_factory=list)
    ended_at: BinlogOffset | None = None
    shadow_of: str | None = None  # the table this one is an online schema change's shadow copy of
    # cut-overs: at each offset the table continued from its shadow table's rows (core/ddl.shadow_of)
    replaced_from: list[tuple[BinlogOffset, str]] = field(default_factory=list)
    routed_to: str | None = None  # the shared Delta table of a routed shard (core/routing.py)
    # added column -> the canonical value the rows older than its ADD COLUMN hold (mysql/column_defaults.py)
    added_defaults: dict[str, Any] = field(default_factory=dict)
    # the changelog holds this table's changes up to here: a generation that replays behind it
    # (a hand-over, a repair) logs only the changes from here on (docs/architecture.md, "Changelog")
    changelog_from: BinlogOffset | None = None

    @property
    def source_schema(self) -> TableSchema:
        """The table's columns in the source: the schema without the columns the lake kept (retired)."""
        if not self.retired_columns:
            return self.schema
        retired = {c.lower() for c in self.retired_columns}
        return replace(self.schema, columns=[c for c in self.schema.columns if c.name.lower() not in retired])

    @property
    def optional_columns(self) -> list[str]:
        """Columns a binlog row image may lack: added by the stream (older images) or retired (newer)."""
        return sorted(set(self.added_columns) | set(self.retired_columns))

    @property
    def chunk_key_columns(self) -> list[str]:
        """The columns the chunks are split on: the key the filter locates a change's chunk by."""
        return list(self.chunks[0].chunk.key_names)

    @property
    def min_high_watermark(self) -> BinlogOffset:
        return min(c.high_watermark for c in self.chunks)

    @property
    def max_high_watermark(self) -> BinlogOffset:
        return max(c.high_watermark for c in self.chunks)

    def offsets(self) -> list[BinlogOffset]:
        """Every offset this table's entry holds."""
        out = [c.high_watermark for c in self.chunks] + list(self.emptied_at) + [o for o, _ in self.replaced_from]
        return out + [o for o in (self.schema_position, self.ended_at, self.changelog_from) if o is not None]

    def rebased(self, translate: Callable[[BinlogOffset], BinlogOffset]) -> CapturedTable:
        """This entry with every offset translated (onto another server: a failover)."""
        return replace(
            self,
            chunks=[FinishedChunk(c.chunk, translate(c.high_watermark)) for c in self.chunks],
            schema_position=None if self.schema_position is None else translate(self.schema_position),
            emptied_at=[translate(o) for o in self.emptied_at],
            ended_at=None if self.ended_at is None else translate(self.ended_at),
            replaced_from=[(translate(o), s) for o, s in self.replaced_from],
            changelog_from=None if self.changelog_from is None else translate(self.changelog_from),
        )

    def follow_ddl(self, new_schema: TableSchema, added: Iterable[str], position: BinlogOffset) -> None:
        """Take the table's definition after a followed ALTER at ``position``."""
        self.schema = new_schema
        self.added_columns = sorted(set(self.added_columns) | set(added))
        self.schema_position = position

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": self.schema.to_dict(),
            "primary_key": list(self.merge_key),
            "splits": [c.to_dict() for c in self.chunks],
        }
        if self.added_columns:
            out["added_columns"] = list(self.added_columns)
        if self.schema_position is not None:
            out["schema_position"] = self.schema_position.to_dict()
        if self.changelog:
            out["changelog"] = True
        if self.metadata_columns:
            out["metadata_columns"] = True
        if self.retired_columns:
            out["retired_columns"] = list(self.retired_columns)
        if self.renamed_columns:
            out["renamed_columns"] = dict(self.renamed_columns)
        if self.emptied_at:
            out["emptied_at"] = [o.to_dict() for o in self.emptied_at]
        if self.ended_at is not None:
            out["ended_at"] = self.ended_at.to_dict()
        if self.shadow_of:
            out["shadow_of"] = self.shadow_of
        if self.replaced_from:
            out["replaced_from"] = [{"offset": o.to_dict(), "table": t} for o, t in self.replaced_from]
        if self.routed_to:
            out["routed_to"] = self.routed_to
        if self.added_defaults:
            out["added_defaults"] = {c: to_json(v) for c, v in self.added_defaults.items()}
        if self.changelog_from is not None:
            out["changelog_from"] = self.changelog_from.to_dict()
        return out

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> CapturedTable:
        for key in ("schema", "primary_key", "splits"):
            if key not in d:
                raise ManifestError(f"stream manifest entry of {name} lacks {key!r}: rebuild the manifest")
        if not d["splits"]:
            raise ManifestError(f"stream manifest has no chunks for {name}: rebuild the manifest")
        pos = d.get("schema_position")
        return cls(
            TableSchema.from_dict(d["schema"]),
            list(d["primary_key"]),
            [FinishedChunk.from_dict(s, name) for s in d["splits"]],
            list(d.get("added_columns", [])),
            None if not pos else BinlogOffset.from_dict(pos),
            bool(d.get("changelog", False)),
            bool(d.get("metadata_columns", False)),
            list(d.get("retired_columns", [])),
            dict(d.get("renamed_columns", {})),
            [BinlogOffset.from_dict(o) for o in d.get("emptied_at", [])],
            BinlogOffset.from_dict(d["ended_at"]) if d.get("ended_at") else None,
            d.get("shadow_of") or None,
            [(BinlogOffset.from_dict(r["offset"]), str(r["table"])) for r in d.get("replaced_from", [])],
            d.get("routed_to") or None,
            {c: from_json(v) for c, v in d.get("added_defaults", {}).items()},
            BinlogOffset.from_dict(d["changelog_from"]) if d.get("changelog_from") else None,
        )


@dataclass(frozen=True)
class Generation:
    """A stream generation: its own checkpoint and Delta transaction app id.

    A new one starts when tables are handed over while the stream ran past their high watermarks:
    it reads from an earlier offset than the old checkpoint (docs/architecture.md, "Hand-overs").
    """

    number: int = 0
    checkpoint: str = DEFAULT_CHECKPOINT
    app_id: str | None = None  # None: the pipeline's default, see :meth:`Manifest.app_id`

    def next(self, pipeline_id: str) -> Generation:
        n = self.number + 1
        return Generation(n, f"{DEFAULT_CHECKPOINT}-g{n}", f"mysqlcdc-stream-{pipeline_id}-g{n}")


@dataclass
class Manifest:
    start_offset: BinlogOffset
    tables: dict[str, CapturedTable]
    collations: dict[str, Collation] = field(default_factory=dict)
    generation: Generation = field(default_factory=Generation)
    selection: CaptureSelection = field(default_factory=CaptureSelection)
    # tables created while streaming that could not be captured: table -> the CREATE's offset and why
    refused: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, tables: dict[str, CapturedTable], collations: dict[str, Collation] | None = None) -> Manifest:
        """A first manifest: the start offset is the minimum HW over every chunk."""
        return cls(_min_hw(tables), dict(tables), dict(collations or {}))

    # ------------------------------------------------------------------ views
    def app_id(self, pipeline_id: str) -> str:
        """The Delta transaction app id of this generation's batches."""
        return self.generation.app_id or f"mysqlcdc-stream-{pipeline_id}"

    def schemas(self) -> dict[str, TableSchema]:
        return {name: t.schema for name, t in self.tables.items()}

    def handoff_filter(self) -> HandoffFilter:
        """Per table, each chunk's HW (and where its capture ended): what decides which changes the
        stream applies."""
        pairs = {name: [(c.chunk, c.high_watermark) for c in t.chunks] for name, t in self.tables.items()}
        ends = {name: t.ended_at for name, t in self.tables.items() if t.ended_at is not None}
        return HandoffFilter(pairs, self.collations, ends)

    def ended_tables(self) -> list[str]:
        """Tables whose capture ended at a DROP/RENAME: the next plan treats them as not captured."""
        return sorted(t for t, e in self.tables.items() if e.ended_at is not None)

    # ------------------------------------------------------------------ changes
    def merged(self, tables: dict[str, CapturedTable], collations: dict[str, Collation]) -> Manifest:
        """This manifest with ``tables`` added or replaced; start offset = min HW over every chunk.
        The generation carries over (only a stream without a checkpoint uses the start offset)."""
        merged = {**self.tables, **tables}
        out = Manifest(_min_hw(merged), merged, {**self.collations, **collations}, self.generation)
        return self._carry(out)

    def with_changelogs(self, flags: dict[str, bool]) -> Manifest:
        """This manifest with each named table's changelog switched on or off."""
        tables = {t: replace(e, changelog=flags.get(t, e.changelog)) for t, e in self.tables.items()}
        return self._carry(Manifest(self.start_offset, tables, self.collations, self.generation))

    def with_changelog_from(self, tables: Iterable[str], offset: BinlogOffset) -> Manifest:
        """This manifest with the named tables' changelogs complete up to ``offset`` (the stream's
        checkpoint at a hand-over): a new generation replaying their changes before it, which the
        old generation logged, does not log them again. Never moves back."""
        names = set(tables)
        out = {t: replace(e, changelog_from=max(offset, e.changelog_from or offset)) if t in names else e
               for t, e in self.tables.items()}  # fmt: skip
        return self._carry(Manifest(self.start_offset, out, self.collations, self.generation))

    def with_metadata_columns(self, tables: Iterable[str], on: bool) -> Manifest:
        """This manifest with the named tables' rows carrying metadata columns (``on``) or not:
        what their Delta tables were just (re)written with."""
        names = set(tables)
        out = {t: replace(e, metadata_columns=on) if t in names else e for t, e in self.tables.items()}
        return self._carry(Manifest(self.start_offset, out, self.collations, self.generation))

    def with_chunks(self, table: str, chunks: Iterable[FinishedChunk]) -> Manifest:
        """This manifest with some chunks of ``table`` replaced (same split ids: a repair's new HWs)."""
        if table not in self.tables:
            raise ManifestError(f"{table} is not captured: only a captured table's chunks can be replaced")
        new = {c.chunk.split_id: c for c in chunks}
        known = {c.chunk.split_id for c in self.tables[table].chunks}
        if set(new) - known:
            raise ManifestError(f"{table} has no chunks {sorted(set(new) - known)} (it has 0..{len(known) - 1})")
        t = self.tables[table]
        tables = {**self.tables, table: replace(t, chunks=[new.get(c.chunk.split_id, c) for c in t.chunks])}
        return self._carry(Manifest(_min_hw(tables), tables, dict(self.collations), self.generation))

    def handed_over(
        self,
        pipeline_id: str,
        checkpoint: BinlogOffset,
        new_tables: Iterable[str],
        fresh_chunks: Mapping[str, Iterable[int]] | None = None,
    ) -> Manifest:
        """A new generation for tables (or, with ``fresh_chunks``, chunks of a table: a repair)
        handed over behind the stream's ``checkpoint`` P: every other chunk gets HW = max(HW, P) —
        its changes before P were applied — and the new generation starts from the minimum HW, i.e.
        the earliest new table's or chunk's."""
        fresh = set(new_tables)
        partly = {t: set(ids) for t, ids in (fresh_chunks or {}).items()}
        tables = {}
        for name, t in self.tables.items():
            if name not in fresh:
                keep = partly.get(name, set())
                chunks = [c if c.chunk.split_id in keep else FinishedChunk(c.chunk, max(c.high_watermark, checkpoint))
                          for c in t.chunks]  # fmt: skip
                t = replace(t, chunks=chunks)
            tables[name] = t
        return self._carry(Manifest(_min_hw(tables), tables, dict(self.collations), self.generation.next(pipeline_id)))

    def restarted(self, pipeline_id: str) -> Manifest:
        """A new generation that starts from the minimum HW with no checkpoint: after a purged
        binlog every table was re-snapshotted, and the old checkpoint's offset no longer exists."""
        generation = self.generation.next(pipeline_id)
        return self._carry(Manifest(_min_hw(self.tables), dict(self.tables), dict(self.collations), generation))

    def rebased(self, pipeline_id: str, translate: Callable[[BinlogOffset], BinlogOffset]) -> Manifest:
        """A new generation with every offset translated onto another server (a failover,
        docs/architecture.md "Offsets and failover"): the old checkpoint's file:pos names a point
        in the old server's binlog only, so it is never read again."""
        tables = {name: t.rebased(translate) for name, t in self.tables.items()}
        generation = self.generation.next(pipeline_id)
        return self._carry(Manifest(_min_hw(tables), tables, dict(self.collations), generation))

    def offsets(self) -> list[BinlogOffset]:
        """Every offset this manifest holds (what a failover must translate)."""
        return [self.start_offset, *(o for t in self.tables.values() for o in t.offsets())]

    def _carry(self, other: Manifest) -> Manifest:
        """``other`` with this manifest's selection and refused tables (what the plan, not the
        snapshot, decides)."""
        other.selection, other.refused = self.selection, dict(self.refused)
        return other

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "start_offset": self.start_offset.to_dict(),
            "tables": {name: t.to_dict() for name, t in self.tables.items()},
            "collations": {name: c.to_dict() for name, c in self.collations.items()},
        }
        if self.selection != CaptureSelection():
            out["selection"] = self.selection.to_dict()
        if self.refused:
            out["refused"] = self.refused
        if self.generation != Generation():
            out.update({"generation": self.generation.number, "checkpoint": self.generation.checkpoint})
            if self.generation.app_id:
                out["app_id"] = self.generation.app_id
        return out

    @classmethod
    def from_dict(cls, d: Any) -> Manifest:
        if not isinstance(d, dict):
            raise ManifestError(f"a stream manifest is a JSON object, got {type(d).__name__}")
        version = d.get("version", MANIFEST_VERSION)  # manifests written before versioning are version 1
        if version != MANIFEST_VERSION:
            raise ManifestError(
                f"stream manifest version {version!r} is not supported (expected {MANIFEST_VERSION}): rebuild it "
                "with this provider version (run the stream operator again)"
            )
        for key in ("start_offset", "tables"):
            if key not in d:
                raise ManifestError(f"stream manifest lacks {key!r}: rebuild it (run the stream operator again)")
        if not d["tables"]:
            raise ManifestError("stream manifest captures no tables: snapshot at least one table first")
        generation = Generation(
            int(d.get("generation", 0)), str(d.get("checkpoint") or DEFAULT_CHECKPOINT), d.get("app_id") or None
        )
        return cls(
            BinlogOffset.from_dict(d["start_offset"]),
            {name: CapturedTable.from_dict(name, t) for name, t in d["tables"].items()},
            {name: Collation.from_dict(c) for name, c in d.get("collations", {}).items()},
            generation,
            CaptureSelection.from_dict(d.get("selection") or {}),
            dict(d.get("refused") or {}),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"the stream manifest is not valid JSON ({exc}): rebuild it") from None
        return cls.from_dict(data)


def _min_hw(tables: dict[str, CapturedTable]) -> BinlogOffset:
    if not tables:
        raise ManifestError("no tables to capture")
    return min(t.min_high_watermark for t in tables.values())


__all__ = [
    "CapturedTable",
    "FinishedChunk",
    "Generation",
    "Manifest",
    "ManifestError",
]
