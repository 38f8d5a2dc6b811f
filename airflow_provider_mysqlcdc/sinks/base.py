"""The sink protocol: where captured tables land.

A sink receives (1) a snapshot group's rows of one table as staged Parquet files that hold exactly
the group's chunks as of the group's high watermark, and (2) later, stream micro-batches. Both
writes must be idempotent: a retried group or batch leaves no duplicate or stale row. Another
sink (a MySQL/Postgres replica, a changelog table, delta-spark on a cluster) is one module that
implements this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa


@dataclass
class StagedFile:
    """A Parquet file written by the snapshot job (already corrected by the binlog window)."""

    path: str  # absolute path/URL
    rows: int
    size: int
    split_ids: list[int] = field(default_factory=list)


class Sink(Protocol):
    def prepare_table(self, table: str, schema: pa.Schema, primary_key: list[str]) -> None:
        """Create the target table if missing (idempotent, safe under concurrent callers)."""

    def staging_location(self, table: str, group_key: str, attempt: str) -> str:
        """Where the snapshot job should stage the group's Parquet files for ``table``."""

    def commit_snapshot_group(
        self, table: str, group_key: str, files: list[StagedFile], schema: pa.Schema, metadata: dict[str, Any]
    ) -> None:
        """Atomically replace whatever an earlier attempt of ``group_key`` wrote with ``files``."""
