"""Changelog tables in Delta: append a batch's changes exactly once, replace a group's snapshot rows.

A source table ``db.t`` with a changelog has it at ``<sink_root>/_changelog/db/t`` (beside the
mirror ``<sink_root>/db/t``). Why exactly once without a key to MERGE on: every stream append
carries the Delta transaction ``(app_id, batch_id)`` the mirror's MERGE carries, in the changelog
table's own log, so a batch replayed after a crash is recognised there as it is in the mirror;
and a snapshot group's rows are written with ``replaceWhere _tx_id = 'snapshot:<plan>:<group>'``,
so a retried group replaces its earlier attempt's rows instead of adding to them
(docs/architecture.md, "Changelog").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from airflow_provider_mysqlcdc.core.changelog import changelog_schema, scd2
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_merge import delta_arrow_schema

log = logging.getLogger(__name__)

CHANGELOG_DIR = "_changelog"


def changelog_uri(sink: DeltaSink, table: str) -> str:
    return f"{sink.root}/{CHANGELOG_DIR}/{TableId.parse(table).path}"


def changelog_exists(sink: DeltaSink, table: str) -> bool:
    return DeltaTable.is_deltatable(changelog_uri(sink, table), storage_options=sink.storage_options)


def recorded_version(sink: DeltaSink, table: str, app_id: str) -> int | None:
    """The last version of ``app_id`` (a stream generation's batch id, or a step logged once per plan)
    that ``table``'s changelog records; None when it records none."""
    if not changelog_exists(sink, table):
        return None
    return DeltaTable(changelog_uri(sink, table), storage_options=sink.storage_options).transaction_version(app_id)


def append_changes(
    sink: DeltaSink,
    table: str,
    table_schema: pa.Schema,
    batches: Iterable[pa.Table],
    app_id: str,
    version: int,
) -> int | None:
    """Append a micro-batch's changelog rows in one commit tagged ``(app_id, version)``.

    ``batches`` is consumed lazily (a huge transaction streams through in bounded memory). Returns
    the rows appended, or None when the changelog already records ``version`` for ``app_id``.
    """
    uri = changelog_uri(sink, table)
    if changelog_exists(sink, table):
        done = DeltaTable(uri, storage_options=sink.storage_options).transaction_version(app_id)
        if done is not None and done >= version:
            log.info("%s changelog: batch %s/%s already appended (records %s); skipped", table, app_id, version, done)
            return None
    rows = _CountedRows(changelog_schema(table_schema), batches)
    write_deltalake(uri, rows.reader(), mode="append", schema_mode="merge", storage_options=sink.storage_options,
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]))  # fmt: skip
    return rows.count


def replace_snapshot_rows(
    sink: DeltaSink, table: str, table_schema: pa.Schema, tables: Iterable[pa.Table], tx_id: str
) -> int:
    """Put a snapshot group's ``r`` rows of ``table`` in its changelog, replacing any earlier
    attempt's rows of the same group: one commit, so readers never see both or neither.
    ``tables`` is consumed lazily; returns the rows written."""
    uri = changelog_uri(sink, table)
    rows = _CountedRows(changelog_schema(table_schema), tables)
    if not changelog_exists(sink, table):
        write_deltalake(uri, rows.reader(), mode="append", schema_mode="merge", storage_options=sink.storage_options)
    else:
        quoted = tx_id.replace("'", "''")
        write_deltalake(uri, rows.reader(), mode="overwrite", predicate=f"_tx_id = '{quoted}'", schema_mode="merge",
                        storage_options=sink.storage_options)  # fmt: skip
    log.info("%s changelog: %d snapshot rows of %s", table, rows.count, tx_id)
    return rows.count


class _CountedRows:
    """Changelog tables streamed to delta-rs as one record batch reader, counting the rows."""

    def __init__(self, schema: pa.Schema, tables: Iterable[pa.Table]):
        self.schema, self.tables, self.count = schema, tables, 0

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self._batches())

    def _batches(self) -> Iterator[pa.RecordBatch]:
        for t in self.tables:
            self.count += t.num_rows
            yield from t.cast(self.schema).to_batches()


def read_changelog(sink: DeltaSink, table: str) -> pa.Table:
    """The whole changelog of ``table`` (unordered; :func:`~airflow_provider_mysqlcdc.core.changelog.order_key`
    sorts it in binlog order)."""
    dt = DeltaTable(changelog_uri(sink, table), storage_options=sink.storage_options)
    out = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    return out.cast(delta_arrow_schema(dt))


def read_scd2(sink: DeltaSink, table: str, key: Sequence[str]) -> pa.Table:
    """The SCD type 2 view of ``table``: its versions with ``valid_from``, ``valid_to``, ``is_current``,
    derived from the changelog at read time (always consistent with it; nothing to maintain)."""
    return scd2(read_changelog(sink, table), key)


__all__ = ["CHANGELOG_DIR", "append_changes", "changelog_exists", "changelog_uri",
           "read_changelog", "read_scd2", "recorded_version", "replace_snapshot_rows"]  # fmt: skip
