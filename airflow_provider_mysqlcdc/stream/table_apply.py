"""One table's changes of a micro-batch, applied in memory: the step the driver's threads and the
apply processes (``stream/apply_processes.py``) share.

Why a module of its own: the same three steps — changelog append, fold to the last change per
key, one commit tagged ``(app_id, batch_id)`` — run in the driver or in a process that owns a share
of the tables, and must be the same code in both (docs/architecture.md, "Applying a batch's tables
at once").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.change_block import decode_blocks, fold_block
from airflow_provider_mysqlcdc.core.changelog import changes_to_changelog
from airflow_provider_mysqlcdc.core.manifest import Manifest
from airflow_provider_mysqlcdc.core.row_metadata import lake_schema
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_changelog import append_changes


class TableChangeApplier:
    """What applying a table's changes needs of the manifest, computed once per manifest."""

    def __init__(self, sink: DeltaSink, manifest: Manifest, app_id: str):
        self.sink = sink
        self.manifest = manifest
        self.app_id = app_id
        self.schemas = manifest.schemas()
        self.arrow = {t: cdc_types.arrow_schema(s) for t, s in self.schemas.items()}
        self.metadata = {t for t, e in manifest.tables.items() if e.metadata_columns}  # core/row_metadata.py
        self.lake = {t: lake_schema(a, t in self.metadata) for t, a in self.arrow.items()}
        self.pks = {t: list(e.merge_key) for t, e in manifest.tables.items()}

    def apply(self, table: str, blobs: Iterable[bytes], batch_id: int) -> None:
        """``table``'s change blocks of batch ``batch_id``: changelog append, fold, one commit (each
        at most once per batch id: a replay finds the batch recorded and skips it)."""
        block = decode_blocks(blobs)
        if block is None:
            return
        entry = self.manifest.tables[table]
        if entry.changelog:
            logged = changes_to_changelog(block, self.arrow[table], entry.changelog_from)
            append_changes(self.sink, table, self.arrow[table], [logged], self.app_id, batch_id)
        upserts, delete_keys = fold_block(block, self.pks[table], table in self.metadata)
        self.sink.apply_changes(table, upserts.cast(self.lake[table]), delete_keys, self.pks[table], self.app_id,
                                batch_id)  # fmt: skip

    def units(self, tables: Iterable[str]) -> dict[str, list[str]]:
        """``tables`` by the Delta table each writes: routed shards of one share it and go one after
        another, in one thread."""
        out: dict[str, list[str]] = defaultdict(list)
        for t in tables:
            out[self.sink.table_uri(t)].append(t)
        return out

    def apply_all(self, work: Mapping[str, list[bytes]], batch_id: int, threads: int) -> None:
        """Every table of ``work`` (table -> its change blocks), up to ``threads`` Delta tables at
        once (delta-rs and file writes release the GIL); raises the first table's failure."""

        def apply_unit(tables: list[str]) -> None:
            for t in tables:
                self.apply(t, work[t], batch_id)

        units = list(self.units(work).values())
        threads = min(threads, len(units))
        if threads <= 1:
            for tables in units:
                apply_unit(tables)
            return
        with ThreadPoolExecutor(threads, thread_name_prefix=f"apply-b{batch_id}") as pool:
            for _ in pool.map(apply_unit, units):
                pass  # map re-raises the first table's failure


__all__ = ["TableChangeApplier"]
