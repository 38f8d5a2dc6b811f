"""The records the snapshot hands on: what a chunk reports, and the files a group staged.

They cross process boundaries (a Spark job writes them to the state store, the stream operator and
the stream read them), so each has exactly one JSON form, written and read here. The stream
manifest, which carries them to the stream, is ``core/manifest.py``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.offset import BinlogOffset


@dataclass(frozen=True)
class ChunkResult:
    """What one finished chunk reports: the offsets that bracket it (its group's) and the rows it holds."""

    table: str
    split_id: int
    group_id: int
    low_watermark: BinlogOffset
    high_watermark: BinlogOffset
    rows: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "split_id": self.split_id,
            "group_id": self.group_id,
            "low_watermark": self.low_watermark.to_dict(),
            "high_watermark": self.high_watermark.to_dict(),
            "rows": self.rows,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChunkResult:
        return cls(
            d["table"],
            int(d["split_id"]),
            int(d["group_id"]),
            BinlogOffset.from_dict(d["low_watermark"]),
            BinlogOffset.from_dict(d["high_watermark"]),
            int(d["rows"]),
            float(d["seconds"]),
        )


@dataclass
class StagedFile:
    """A Parquet file a snapshot group staged (already corrected by its binlog window)."""

    path: str  # absolute path/URL
    rows: int
    size: int
    split_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "size": self.size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagedFile:
        return cls(str(d["path"]), int(d["rows"]), int(d["size"]))


@dataclass
class GroupReport:
    """What a finished snapshot group leaves in the state store: its chunks' results, a summary for
    logs and XCom, the attempt that wrote it, and (for a re-snapshot) the files to swap in later."""

    group_id: int
    chunks: list[ChunkResult]
    summary: dict[str, Any] = field(default_factory=dict)
    attempt: str = ""
    staged_files: dict[str, list[StagedFile]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "chunks": [c.to_dict() for c in self.chunks],
            "summary": self.summary,
            "attempt": self.attempt,
            "staged_files": {t: [f.to_dict() for f in fs] for t, fs in self.staged_files.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupReport:
        return cls(
            int(d["group_id"]),
            [ChunkResult.from_dict(c) for c in d.get("chunks", [])],
            dict(d.get("summary", {})),
            str(d.get("attempt", "")),
            {t: [StagedFile.from_dict(f) for f in fs] for t, fs in d.get("staged_files", {}).items()},
        )


__all__ = ["ChunkResult", "GroupReport", "StagedFile"]
