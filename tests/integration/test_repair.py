"""``repair_chunks`` on a REAL pipeline: verify names damaged chunks, repair re-snapshots only them.

The stream runs throughout (in this process, as the stream job runs it: hand-overs pause and
resume it); a random writer runs while the chunks are re-snapshotted and swapped in. The damage
is planted with no writer running, so verify's finding is exact; the repair commit must touch only
data files that hold rows of the repaired chunks, and afterwards verify and a row-by-row
comparison find every table equal to its source.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.pipeline import finalize_run, plan_run
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import request_stop, wait_until_applied
from airflow_provider_mysqlcdc.verify import verify_pipeline
from tests.support.mariadb import MariaDBServer
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.stream_thread import streaming_pipeline
from tests.support.verify import compare

pytestmark = pytest.mark.integration

ROWS = 5_000
PIPELINE = "rp"


def _caught_up(settings: Any, store: StateStore) -> None:
    with settings.connect() as conn:
        wait_until_applied(store, current_offset(conn), timeout=180)


def _chunk_keys_of_file(path: str, manifest: Any, table: str) -> set[int]:
    entry = manifest.tables[table]
    splits = sorted((c.chunk for c in entry.chunks), key=lambda s: s.split_id)
    keys = pq.read_table(path, columns=entry.chunk_key_columns)
    rows = list(zip(*(keys.column(c).to_pylist() for c in entry.chunk_key_columns), strict=True))
    return {splits[i].split_id for i in ChunkLocator(splits, manifest.collations).indexes_of(rows)}


@pytest.mark.timeout(900)
def test_repair_swaps_only_the_damaged_chunks_while_the_stream_runs(  # type: ignore[no-untyped-def]
    mariadb: MariaDBServer, db: str, cdc_settings, spark, tmp_path: Path
) -> None:
    tables = make_tables(mariadb, db, rows=ROWS)
    store, sink, stream = streaming_pipeline(spark, cdc_settings, tmp_path, PIPELINE, tables, 500, "repair-test")
    writer = RandomWriter(mariadb, db, rows=ROWS, seed=5)
    try:
        writer.start()
        time.sleep(3)
        writer.stop_event.set()
        writer.join()
        _caught_up(cdc_settings, store)

        # damage two tables in the lake while the stream runs, with nothing writing the source
        t_int, t_comp = f"{db}.t_int", f"{db}.t_comp"
        victim = sink.read(t_int).column("id").to_pylist()[1234]
        DeltaTable(sink.table_uri(t_int)).update(predicate=f"id = {victim}", updates={"note": "'damaged'"})
        gone = sink.read(t_comp).select(["region", "n"]).slice(321, 1).to_pylist()[0]
        DeltaTable(sink.table_uri(t_comp)).delete(f"region = '{gone['region']}' AND n = {gone['n']}")
        found = verify_pipeline(cdc_settings, store, sink, wait_timeout=60)
        damaged = {v.table: v.differing for v in found.verdicts if v.differing}
        assert set(damaged) == {t_int, t_comp} and all(len(c) == 1 for c in damaged.values()), found.summary()
        manifest = store.read_manifest()
        old_hw = {t: {c.chunk.split_id: c.high_watermark for c in manifest.tables[t].chunks} for t in damaged}

        # repair while the writer changes every table again
        writer = RandomWriter(mariadb, db, rows=ROWS, seed=6)
        writer.start()
        config = PipelineConfig.from_params(pipeline_id=PIPELINE, sink_root=str(tmp_path / "lake"),
                                            state_root=str(tmp_path / "state"), tables=tables,
                                            chunk_size=500, repair_chunks=json.dumps(damaged))  # fmt: skip
        with cdc_settings.connect() as conn:
            outcome = plan_run(conn, store, config, "repair1", sink.exists, table_owner=sink.owner_of)
        assert outcome.repair_chunks == damaged and outcome.snapshot_tables == []
        assert outcome.chunks == 2 and len(outcome.groups) == 1
        before = {t: DeltaTable(sink.table_uri(t)).version() for t in damaged}
        for g in outcome.groups:
            run_snapshot_group(spark, cdc_settings, store, "repair1", g["group_id"], sink)
        result = finalize_run(store, sink, "repair1", stop_timeout=120)
        assert result.repaired == damaged and result.reloaded, result
        time.sleep(2)
        writer.stop_event.set()
        writer.join()
        assert stream.error is None and stream.is_alive(), stream.error
        _caught_up(cdc_settings, store)

        # the repaired chunks got new HWs, the others kept theirs
        after = store.read_manifest()
        for t, ids in damaged.items():
            hws = {c.chunk.split_id: c.high_watermark for c in after.tables[t].chunks}
            assert all(hws[i] > old_hw[t][i] for i in ids)
        # the repair commit removed only files holding rows of the repaired chunks
        for t, ids in damaged.items():
            dt = DeltaTable(sink.table_uri(t))
            commits = [h for h in dt.history() if "repair_chunks" in str(h.get("mysqlcdc", ""))
                       and int(h["version"]) > before[t]]  # fmt: skip
            assert len(commits) == 1, [h.get("mysqlcdc") for h in dt.history()[:5]]
            version = int(commits[0]["version"])
            actions = [json.loads(line) for line in
                       open(f"{sink.table_uri(t)}/_delta_log/{version:020d}.json").read().splitlines()]  # fmt: skip
            removed = [a["remove"]["path"] for a in actions if "remove" in a]
            assert removed, actions
            for rel in removed:
                assert _chunk_keys_of_file(f"{sink.table_uri(t)}/{rel}", manifest, t) & set(ids), rel

        clean = verify_pipeline(cdc_settings, store, sink, wait_timeout=60)
        assert clean.ok, clean.summary()
        with cdc_settings.connect() as conn:
            for t in tables:
                cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
                assert cmp.match, f"{t}: {cmp}"
    finally:
        writer.stop_event.set()
        request_stop(store, timeout=60)
        stream.stop_event.set()
        stream.join(timeout=120)
