"""One table's changes of a micro-batch, applied in memory: the step the driver's threads and the
apply processes (``stream/apply_processes.py``) share.

Why a module of its own: the same three steps — changelog append, fold to the last change per
key, one commit tagged ``(app_id, batch_id)`` — run in the driver or in a process that owns a share
of the tables, and must be the same code in both (docs/architecture.md, "Applying a batch's tables
at once").
"""

from __future__ import annotations

from collections.abc import Iterable

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
        if self.manifest.tables[table].changelog:
            append_changes(self.sink, table, self.arrow[table], [changes_to_changelog(block, self.arrow[table])],
                           self.app_id, batch_id)  # fmt: skip
        upserts, delete_keys = fold_block(block, self.pks[table], table in self.metadata)
        self.sink.apply_changes(table, upserts.cast(self.lake[table]), delete_keys, self.pks[table], self.app_id,
                                batch_id)  # fmt: skip

    def unit_of(self, table: str) -> str:
        """The Delta table ``table`` writes: routed shards of one share it and go one after another."""
        return self.sink.table_uri(table)


__all__ = ["TableChangeApplier"]
