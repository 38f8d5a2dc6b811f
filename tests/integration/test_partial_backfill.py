"""``snapshot_filters`` (a partial backfill) and ``max_rows_per_second`` on a REAL pipeline.

The stream runs throughout (in this process, as the stream job runs it); a random writer changes
every table while the filtered rows are read again and swapped in, including key moves into and
out of a filter (t_comp's region is part of its key). The lake is damaged first in a column the
writer never changes, in rows the writer never touches: rows the filter selects must come back
repaired, rows it does not select must stay exactly as damaged (the backfill touches only matching
rows), and everything else must equal the source. Both readers, each throttled; with the JDBC
reader the stream is stopped during the backfill, so it resumes from a checkpoint before the new
high watermarks and must still apply the changes of the rows the filter did not select.
"""

from __future__ import annotations

import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.pipeline import PipelineStateError, finalize_run, plan_run
from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import request_stop, wait_until_applied
from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.stream_thread import StreamThread, streaming_pipeline
from tests.support.verify import compare

pytestmark = pytest.mark.integration

ROWS = 5_000
SELECTED = [i for i in range(13, ROWS, 10)][::15]  # id % 10 = 3: the filter selects them
UNSELECTED = [i for i in range(14, ROWS, 10)][::15]  # id % 10 = 4: it does not
FILTER_INT = "id % 10 = 3"
FILTER_COMP = "region = 'us'"


class SparingWriter(RandomWriter):
    """The random writer, never touching the damaged t_int rows (nor moving a key onto them)."""

    spared = set(SELECTED) | set(UNSELECTED)

    def statement(self) -> str:
        while True:
            s = super().statement()
            ids = {int(m) for m in re.findall(r"\bid = (\d+)", s)}
            if not ids & self.spared:
                return s


def _caught_up(settings: Any, store: StateStore) -> None:
    with settings.connect() as conn:
        wait_until_applied(store, current_offset(conn), timeout=180)


def _source_rows(conn: Any, table: str) -> dict[int, tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, v, note, amount FROM {table}")
        return {int(r[0]): (int(r[1]), r[2], Decimal(r[3])) for r in cur.fetchall()}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("reader", "stream_running"), [("native", True), ("jdbc", False)])
def test_partial_backfill_refreshes_only_the_rows_its_filter_selects(  # type: ignore[no-untyped-def]
    mariadb: MariaDBServer, db: str, cdc_settings, spark, tmp_path: Path, reader: str, stream_running: bool
) -> None:
    tables = make_tables(mariadb, db, rows=ROWS)
    pid = f"pb{reader[0]}"
    store, sink, stream = streaming_pipeline(spark, cdc_settings, tmp_path, pid, tables, 500, "partial-test")
    writer = SparingWriter(mariadb, db, rows=ROWS, seed=11)
    t_int, t_comp = f"{db}.t_int", f"{db}.t_comp"
    try:
        writer.start()
        time.sleep(2)
        writer.stop_event.set()
        writer.join()
        _caught_up(cdc_settings, store)

        # damage t_int's amount (no statement of the writer sets it on an existing row) in rows the
        # filter selects and rows it does not
        damaged = ",".join(str(i) for i in SELECTED + UNSELECTED)
        DeltaTable(sink.table_uri(t_int)).update(predicate=f"id IN ({damaged})", updates={"amount": "-1"})
        manifest = store.read_manifest()
        chunk_ids = {t: sorted(c.chunk.split_id for c in manifest.tables[t].chunks) for t in (t_int, t_comp)}

        if not stream_running:
            request_stop(store, timeout=60)
            stream.stop_event.set()
            stream.join(timeout=120)
        writer = SparingWriter(mariadb, db, rows=ROWS, seed=12)
        writer.start()
        params = dict(pipeline_id=pid, sink_root=str(tmp_path / "lake"), state_root=str(tmp_path / "state"),
                      tables=tables, chunk_size=500, max_rows_per_second=4000,
                      snapshot_filters={t_int: FILTER_INT, t_comp: FILTER_COMP})  # fmt: skip
        with cdc_settings.connect() as conn:
            outcome = plan_run(conn, store, PipelineConfig.from_params(**params), "pb1", sink.exists,
                               table_owner=sink.owner_of)  # fmt: skip
        assert outcome.snapshot_tables == [] and outcome.repair_chunks == chunk_ids, outcome
        staged, highs = 0, []
        for g in outcome.groups:
            opts = SnapshotOptions(reader=reader)
            res = run_snapshot_group(spark, cdc_settings, store, "pb1", g["group_id"], sink, opts)
            staged, highs = staged + res.rows, [*highs, res.high_watermark]
        # only the selected rows were read (plus the keys the writer changed inside the bracket)
        assert staged < ROWS // 10 + ROWS // 3 + 400, staged
        result = finalize_run(store, sink, "pb1", stop_timeout=120)
        assert result.repaired == chunk_ids and result.reloaded == stream_running, result
        time.sleep(2)
        writer.stop_event.set()
        writer.join()
        if not stream_running:  # the checkpoint is behind the new HWs: the filtered chunks' HWs are put back to it
            ckpt = BinlogOffset.from_dict(result.checkpoint_offset)
            assert ckpt < min(highs), (ckpt, highs)
            after = store.read_manifest()
            assert {c.high_watermark for t in chunk_ids for c in after.tables[t].chunks} == {ckpt}
            stream = StreamThread(spark, cdc_settings, store, sink, "partial-test-2").start_running()
        assert stream.error is None and stream.is_alive(), stream.error
        _caught_up(cdc_settings, store)

        lake = sink.read(t_int).to_pydict()
        lake_rows = {i: (v, n, a) for i, v, n, a in zip(lake["id"], lake["v"], lake["note"], lake["amount"],
                                                         strict=True)}  # fmt: skip
        with cdc_settings.connect() as conn:
            source = _source_rows(conn, t_int)
            # the unselected damaged rows are exactly as damaged: the backfill did not touch them
            for i in UNSELECTED:
                assert lake_rows[i] == (*source[i][:2], Decimal("-1.00")), (i, lake_rows[i], source[i])
            # every other row of t_int equals the source (the selected damaged rows are repaired)
            assert {i: r for i, r in lake_rows.items() if i not in UNSELECTED} == {
                i: r for i, r in source.items() if i not in UNSELECTED
            }
            for t in tables:
                if t != t_int:
                    cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
                    assert cmp.match, f"{t}: {cmp}"

            # a filter on a table not captured, and one the server cannot parse, stop the plan
            mariadb.execute(f"CREATE TABLE `{db}`.t_new (id INT PRIMARY KEY)", database=db)
            for filters, expected in (({f"{db}.t_new": "id > 0"}, "does not capture yet"),
                                      ({t_int: "no_such_column > 0"}, "no_such_column")):  # fmt: skip
                bad = PipelineConfig.from_params(**{**params, "tables": [*tables, f"{db}.t_new"],
                                                    "snapshot_filters": filters})  # fmt: skip
                with pytest.raises(PipelineStateError, match=expected):
                    plan_run(conn, store, bad, "pb-bad", sink.exists, table_owner=sink.owner_of)
    finally:
        writer.stop_event.set()
        request_stop(store, timeout=60)
        stream.stop_event.set()
        stream.join(timeout=120)
