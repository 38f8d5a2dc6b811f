"""Manifests for benchmarks and tests that stream a range of the binlog with no snapshot filter."""

from __future__ import annotations

from dataclasses import replace

from airflow_provider_mysqlcdc.core.manifest import FinishedChunk, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset


def manifest_from(base: Manifest, start: BinlogOffset) -> Manifest:
    """``base`` with the start offset and every chunk's HW set to ``start``: every change after it passes."""
    tables = {
        name: replace(t, chunks=[FinishedChunk(c.chunk, start) for c in t.chunks]) for name, t in base.tables.items()
    }
    return Manifest(start, tables, dict(base.collations), base.generation)
