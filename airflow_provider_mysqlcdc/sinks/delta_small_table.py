"""Apply a stream batch to a SMALL Delta table by rewriting the whole table as one file, once.

Why: a database of hundreds of small tables gets a batch touching most of them; a delta-rs MERGE
plans a DataFusion query per call, which is most of a small table's apply time, and a file-by-file
rewrite leaves one more file per batch to match next time. A table of a few MiB is read whole,
the batch's changed keys dropped, its upserts added, and written back as ONE sorted file in one
commit that removes every file it read — the same result as the MERGE, the same Delta transaction
``(app_id, version)`` (a replay is skipped), and a table that stays one file however many batches
it takes (docs/architecture.md, "Applying a batch's tables at once"). A routed shard rewrites its
own partition only. Bigger tables keep the MERGE (:mod:`~airflow_provider_mysqlcdc.sinks.delta_merge`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from airflow_provider_mysqlcdc.core.routing import SOURCE_COLUMNS
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.sinks.delta_files import remove_action
from airflow_provider_mysqlcdc.sinks.delta_merge import (
    COMMIT_ATTEMPTS,
    already_applied,
    conform_upserts,
    delta_arrow_schema,
)
from airflow_provider_mysqlcdc.sinks.delta_rewrite import _added, _conform, _FileWriter, _TableFiles
from airflow_provider_mysqlcdc.sinks.delta_routing import file_schema
from airflow_provider_mysqlcdc.spill.changed_keys import member_mask

log = logging.getLogger(__name__)


def rewrite_small_table(
    sink: DeltaSink,
    table: str,
    upserts: pa.Table,
    deletes: pa.Table,
    primary_key: list[str],
    app_id: str,
    version: int,
    opened: DeltaTable | None = None,
) -> bool:
    """Make ``table`` (its shard, if routed) its rows minus the changed keys plus ``upserts``, as one
    file in one commit tagged ``(app_id, version)``; False if the table already records ``version``.

    ``upserts``/``deletes`` are a folded batch (each key once), as for :meth:`DeltaSink.apply_changes`.
    """
    route = sink.route_of(table)
    if route:
        app_id = route.app_id(app_id)
    key = list(primary_key)
    dt = opened
    for attempt in range(COMMIT_ATTEMPTS):
        if dt is None:
            dt = sink.open(table)
        sink.check_owner(table, dt)
        if already_applied(dt, table, app_id, version):
            return False
        full = delta_arrow_schema(dt)
        schema = file_schema(full) if route else full
        have = sink.table_files(table, dt)
        files = _TableFiles.of(sink, table, route)
        parts = [_conform(files.reader(rel).read(), schema) for rel in have]
        current = pa.concat_tables(parts) if parts else schema.empty_table()
        key_schema = pa.schema([schema.field(c) for c in key])
        changed = pa.concat_tables([upserts.select(key).cast(key_schema), deletes.select(key).cast(key_schema)])
        drop = member_mask(current.select(key), changed, key) if current.num_rows else np.zeros(0, dtype=bool)
        rows = pa.concat_tables([current.filter(pa.array(~drop)),
                                 conform_upserts(table, schema, upserts, fill_absent=route is not None)])  # fmt: skip
        out = _FileWriter(files, f"{files.stream_dir}/b{version:010d}-{uuid.uuid4().hex[:12]}", "table", schema, dt)
        if rows.num_rows:
            out.write(rows.sort_by([(c, "ascending") for c in key]))
        out.close()
        now = int(time.time() * 1000)
        actions = [*(remove_action(rel, size, now) for rel, size in have.items()), *_added(out.written, route, now, dt)]
        commit = CommitProperties(
            app_transactions=[Transaction(app_id, version)],
            custom_metadata={"mysqlcdc": json.dumps({"app_id": app_id, "version": version, "upserts": upserts.num_rows,
                                                     "deletes": deletes.num_rows, "small_table_rewrite": True})},
        )  # fmt: skip
        try:
            dt.create_write_transaction(actions, mode="append", schema=full, commit_properties=commit,
                                        partition_by=list(SOURCE_COLUMNS) if route else None)  # fmt: skip
        except CommitFailedError as exc:  # a concurrent commit (a snapshot group): read the table again
            log.info("%s: batch %s/%s conflicted with a concurrent commit (%s); retrying",
                     table, app_id, version, str(exc).splitlines()[0])  # fmt: skip
            dt = None
            time.sleep(min(0.05 * (attempt + 1), 1.0))
            continue
        log.debug("%s: batch %s/%s rewrote %d file(s) into %d (%d rows; %d upserts, %d deletes)", table, app_id,
                  version, len(have), len(out.written), rows.num_rows, upserts.num_rows, deletes.num_rows)  # fmt: skip
        return True
    raise RuntimeError(
        f"could not apply batch {app_id}/{version} to {table}: {COMMIT_ATTEMPTS} attempts conflicted with "
        "concurrent commits; is another job writing this table?"
    )


__all__ = ["rewrite_small_table"]
