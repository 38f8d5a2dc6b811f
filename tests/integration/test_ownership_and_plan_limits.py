"""A Delta table belongs to one pipeline, and plans out of proportion are refused before any work.

Real MariaDB, real delta-rs, real snapshot groups (Spark local[2]): pipeline ``a`` captures a table;
pipeline ``b`` aimed at the same sink is refused at plan time and at every write, with the owner
named and the fix; with ``takeover_tables`` it re-snapshots the table, swaps it in and owns it —
and then ``a``'s writes are refused, naming ``b``. A tiny chunk size and a plan with too many chunks
per table are refused with the numbers unless ``allow_large_plan`` is set.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc import plan_rules as pipeline_mod  # the plan limits live there
from airflow_provider_mysqlcdc.core.config import PipelineConfig, PipelineConfigError
from airflow_provider_mysqlcdc.pipeline import PipelineStateError, finalize_run, plan_run
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink, TableOwnedError
from airflow_provider_mysqlcdc.snapshot.group import run_snapshot_group
from airflow_provider_mysqlcdc.state import StateStore

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _config(tmp_path: Any, pipeline: str, table: str, **kw: Any) -> PipelineConfig:
    roots = {"sink_root": str(tmp_path / "lake"), "state_root": str(tmp_path / "state")}
    return PipelineConfig.from_params(pipeline_id=pipeline, tables=[table], chunk_size=500, **roots, **kw)


def _capture(spark: Any, cdc_settings: Any, tmp_path: Any, config: PipelineConfig) -> DeltaSink:
    """Plan, snapshot and finalize one run of ``config`` (no stream): what the DAG does minus the stream."""
    store = StateStore(config.state_root, config.pipeline_id)
    sink = DeltaSink(config.sink_root, owner=config.pipeline_id)
    with cdc_settings.connect() as conn:
        outcome = plan_run(conn, store, config, f"plan-{config.pipeline_id}", sink.exists, table_owner=sink.owner_of,
                           airflow_run_id="manual__test")  # fmt: skip
    for g in outcome.groups:
        run_snapshot_group(spark, cdc_settings, store, outcome.plan_id, g["group_id"],
                           DeltaSink(config.sink_root, owner=config.pipeline_id))  # fmt: skip
    finalize_run(store, sink, outcome.plan_id)
    return sink


def test_a_table_belongs_to_one_pipeline_until_taken_over(mariadb, db, cdc_settings, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = f"{db}.t"
    mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)",
                    f"INSERT INTO {table} SELECT seq, seq FROM seq_1_to_3000", database=db)  # fmt: skip
    a = _capture(spark, cdc_settings, tmp_path, _config(tmp_path, "a", table))
    assert a.owner_of(table) == "a"
    assert StateStore(str(tmp_path / "state"), "a").read_plan("plan-a")["airflow_run_id"] == "manual__test"

    # b, same sink: refused at plan time, naming the owner and the way out
    with pytest.raises(PipelineStateError, match=r"pipeline 'a'.*takeover_tables=\['" + table):
        _capture(spark, cdc_settings, tmp_path, _config(tmp_path, "b", table))
    # ... and at every write, whoever calls
    b = DeltaSink(str(tmp_path / "lake"), owner="b")
    upserts = pa.table({"id": pa.array([1], pa.int32()), "v": pa.array([-1], pa.int32())})
    with pytest.raises(TableOwnedError, match="belongs to pipeline 'a'"):
        b.apply_changes(table, upserts, upserts.select(["id"]).slice(0, 0), ["id"], "app-b", 0)

    # takeover: b re-snapshots the table and swaps it in; from then on it is b's
    mariadb.execute(f"UPDATE {table} SET v = -v WHERE id <= 10", database=db)
    b = _capture(spark, cdc_settings, tmp_path, _config(tmp_path, "b", table, takeover_tables=[table]))
    assert b.owner_of(table) == "b"
    rows = {r["id"]: r["v"] for r in b.read(table).to_pylist()}
    assert len(rows) == 3000 and rows[5] == -5  # the re-snapshot's rows, swapped in whole
    with pytest.raises(TableOwnedError, match="belongs to pipeline 'b'"):
        DeltaSink(str(tmp_path / "lake"), owner="a").apply_changes(
            table, upserts, upserts.select(["id"]).slice(0, 0), ["id"], "app-a", 99
        )
    with pytest.raises(TableOwnedError, match="belongs to pipeline 'b'"):  # a's snapshot groups too
        DeltaSink(str(tmp_path / "lake"), owner="a").prepare_table(table, pa.schema([("id", pa.int32())]), ["id"])


def test_plans_out_of_proportion_are_refused_with_the_numbers(mariadb, db, cdc_settings, tmp_path,
                                                             monkeypatch) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    table = f"{db}.t"
    mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)",
                    f"INSERT INTO {table} SELECT seq, seq FROM seq_1_to_5000", database=db)  # fmt: skip
    params = {"pipeline_id": "p", "sink_root": str(tmp_path / "lake"), "state_root": str(tmp_path / "state"),
              "tables": [table]}  # fmt: skip
    with pytest.raises(PipelineConfigError, match="chunk_size 1 is below 100 rows"):
        PipelineConfig.from_params(**params, chunk_size=1)
    assert PipelineConfig.from_params(**params, chunk_size=1, allow_large_plan=True).chunk_size == 1
    store = StateStore(str(tmp_path / "state"), "p")
    monkeypatch.setattr(pipeline_mod, "MAX_CHUNKS_PER_TABLE", 20)  # 5,000 rows / 100 = 50 chunks
    config = PipelineConfig.from_params(**params, chunk_size=100)
    with cdc_settings.connect() as conn, pytest.raises(PipelineStateError, match=r"50 chunks of 100 rows \(limit 20"):
        plan_run(conn, store, config, "p1", lambda t: False)
    allowed = PipelineConfig.from_params(**params, chunk_size=100, allow_large_plan=True)
    with cdc_settings.connect() as conn:
        assert plan_run(conn, store, allowed, "p2", lambda t: False).chunks == 50
