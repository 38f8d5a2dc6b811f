"""Give every row a Delta table holds a value in some columns, in one commit: the lake side of an
``ADD COLUMN ... DEFAULT``.

Why: the source fills a new column of its existing rows with the default and logs no row change,
while the Delta table only gains the column (NULL in every file written before). Each data file is
rewritten once with the values set, file for file (the key-range layout of the snapshot's files is
kept), streamed row group by row group, and one commit swaps them all: readers see the table before
or after, never half of it. A routed shard rewrites its own partition only. Delta has no
"default for older files" that every reader honours, so this costs one read and write of the table,
as the ALTER did on the source.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties

from airflow_provider_mysqlcdc.core.canonical_json import to_json
from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_dv_purge import purge_deletion_vectors
from airflow_provider_mysqlcdc.sinks.delta_files import remove_action
from airflow_provider_mysqlcdc.sinks.delta_merge import COMMIT_ATTEMPTS, delta_arrow_schema
from airflow_provider_mysqlcdc.sinks.delta_rewrite import READ_BATCH_ROWS, _added, _conform, _FileWriter, _TableFiles
from airflow_provider_mysqlcdc.sinks.delta_routing import file_schema

log = logging.getLogger(__name__)


def fill_columns(sink: DeltaSink, table: str, values: Mapping[str, Any]) -> int:
    """Set ``values`` (column -> canonical value) in every row of ``table`` (its shard, if routed) in
    one commit; the number of rows. Idempotent."""
    route = sink.route_of(table)
    for attempt in range(COMMIT_ATTEMPTS):
        dt = sink.open(table)
        sink.check_owner(table, dt)
        if purge_deletion_vectors(sink, table, dt):  # files are read as Parquet and removed by path below
            dt = sink.open(table)
        full = delta_arrow_schema(dt)
        schema = file_schema(full) if route else full
        missing = [c for c in values if c not in schema.names]
        if missing:
            raise ValueError(f"{table}: cannot fill {missing}: the Delta table has no such column")
        have = sink.table_files(table, dt)
        if not have:
            return 0
        files = _TableFiles.of(sink, table, route)
        directory = f"{files.stream_dir}/fill-{uuid.uuid4().hex[:12]}"
        written = []
        rows = 0
        for i, rel in enumerate(sorted(have)):  # one new file per old one: the key-range layout stays
            out = _FileWriter(files, directory, f"part-{i:05d}", schema, dt.metadata().configuration)
            for batch in files.reader(rel).iter_batches(batch_size=READ_BATCH_ROWS):
                data = _conform(pa.Table.from_batches([batch]), schema)
                for name, value in values.items():
                    f = schema.field(name)
                    data = data.set_column(schema.get_field_index(name), f,
                                           pa.array([value] * data.num_rows, type=f.type))  # fmt: skip
                out.write(data)
                rows += data.num_rows
            out.close()
            written += out.written
        now = int(time.time() * 1000)
        actions = [*(remove_action(rel, size, now) for rel, size in have.items()), *_added(written, route, now, dt)]
        filled = {c: to_json(v) for c, v in values.items()}
        commit = CommitProperties(custom_metadata={"mysqlcdc": json.dumps({"filled_columns": filled, "rows": rows})})
        try:
            dt.create_write_transaction(actions, mode="append", schema=full, commit_properties=commit,
                                        partition_by=list(SOURCE_COLUMNS) if route else None)  # fmt: skip
        except CommitFailedError as exc:  # a concurrent commit (a snapshot group): read the table again
            log.info("%s: filling %s conflicted with a concurrent commit (%s); retrying",
                     table, list(values), str(exc).splitlines()[0])  # fmt: skip
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        log.info("%s: set %s in its %d existing rows (%d files rewritten in one commit)", table, filled, rows,
                 len(have))  # fmt: skip
        return rows
    raise RuntimeError(f"could not fill {list(values)} in {table}: {COMMIT_ATTEMPTS} attempts conflicted")


__all__ = ["fill_columns"]
