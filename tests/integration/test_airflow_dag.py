"""The example DAG end to end in Airflow's test mode: real MariaDB, real Spark, real Airflow.

One pipeline goes through the life a data engineer gives it, in order (the tests share it):

1. first run: plan -> >= 2 mapped snapshot tasks (one spark-submit each) -> detached stream ->
   deferrable catch-up sensor, under a random writer; sink == source after catch-up;
2. add a table by param: only the new table is snapshotted while the stream runs on; the stream is
   paused for the hand-over and resumes with the merged manifest in the same Spark application;
   all three tables equal their sources;
3. re-snapshot from the trigger form: a Delta table damaged on purpose is re-snapshotted and
   swapped in one commit; the others are not touched; all tables equal their sources;
4. ``mysqlcdc status`` / ``mysqlcdc stop`` on the running stream.

Bad params are tested at both layers: the DAG's JSON schema (trigger form) and the plan task.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import stream_state, wait_until_applied
from tests.support.airflow_env import load_dag, run_dag
from tests.support.background import BackgroundCall
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.verify import compare

ROWS = 12_000
DB = "cdc"
PIPELINE = "shop"


@pytest.fixture(scope="module")
def pipeline(private_server: Any, airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("airflow-pipeline")
    private_server.execute(f"CREATE DATABASE {DB}")
    tables = make_tables(private_server, DB, rows=ROWS)
    saved = {k: os.environ.get(k) for k in ("AIRFLOW_CONN_MYSQL_CDC_DEFAULT", "AIRFLOW_CONN_SPARK_DEFAULT")}
    os.environ["AIRFLOW_CONN_MYSQL_CDC_DEFAULT"] = private_server.airflow_conn_json()
    os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": "local[2]"})
    ctx = {
        "server": private_server,
        "settings": private_server.cdc_settings(),
        "tables": tables,  # cdc.t_int, cdc.t_comp, cdc.t_ci
        "conf": {
            "pipeline_id": PIPELINE,
            "sink_root": str(work / "lake"),
            "state_root": str(work / "state"),
            "chunk_size": 2_000,
            "chunks_per_task": 4,
        },
        "dag": load_dag("mysql_cdc"),
    }
    try:
        yield ctx
    finally:
        from airflow_provider_mysqlcdc.stream.control import request_stop

        request_stop(StateStore(ctx["conf"]["state_root"], PIPELINE), timeout=60)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _store(p: dict) -> StateStore:
    return StateStore(p["conf"]["state_root"], PIPELINE)


def _catch_up_and_compare(p: dict, tables: list[str]) -> None:
    with p["settings"].connect() as conn:
        target = current_offset(conn)
    wait_until_applied(_store(p), target, timeout=240)
    sink = DeltaSink(p["conf"]["sink_root"])
    with p["settings"].connect() as conn:
        for t in tables:
            cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
            assert cmp.match, f"{t}: {cmp}"
            assert cmp.source_rows > ROWS // 2


def _run_under_writer(p: dict, conf: dict, seed: int, before: float = 1.0, after: float = 3.0) -> Any:
    writer = RandomWriter(p["server"], DB, rate=120.0, seed=seed, rows=ROWS)
    writer.start()
    try:
        time.sleep(before)
        run = run_dag(p["dag"], {**p["conf"], **conf})
        time.sleep(after)  # the stream applies changes made after the run finished
    finally:
        writer.stop_event.set()
        writer.join()
    assert writer.transactions > 100 * (before + after), writer.transactions
    return run


def test_first_run_snapshots_in_mapped_tasks_and_streams(pipeline: dict) -> None:
    first = pipeline["tables"][:2]  # t_int, t_comp
    run = _run_under_writer(pipeline, {"tables": first, "verify": True}, seed=11)
    assert run.state == "success", run.task_states
    groups = run.xcom("plan")
    assert len(groups) >= 2 and {g["group_id"] for g in groups} == set(range(len(groups)))
    assert run.states_of("snapshot") == ["success"] * len(groups)
    summaries = run.mapped_xcoms("snapshot")
    assert len(summaries) == len(groups)
    record = _store(pipeline).read_plan(run.xcom("plan", key="plan_id"))
    planned_chunks = sum(len(g["splits"]) for g in record["groups"])
    assert sum(s["chunks"] for s in summaries) == planned_chunks >= 10
    assert set().union(*(s["tables"] for s in summaries)) == set(first)
    assert sum(s["rows"] for s in summaries) >= 2 * ROWS * 0.9
    for s in summaries:
        assert s["min_hw"] and s["max_hw"] and s["rows"] > 0
        assert BinlogOffset.from_dict(s["min_hw"]) <= BinlogOffset.from_dict(s["max_hw"])
    assert [s["group_label"] for s in summaries] == [g["group_label"] for g in groups]
    for g in groups:  # issue 33 item 8a: a short label; the tables and chunk ranges in the rendered fields
        n, tables = len(record["groups"][g["group_id"]]["splits"]), len(summaries[g["group_id"]]["tables"])
        assert re.fullmatch(rf"group {g['group_id']}: {tables} tables?, {n} chunks?", g["group_label"]), g
        assert run.labels[("snapshot", g["group_id"])] == g["group_label"]
        chunks = run.rendered[("snapshot", g["group_id"])]["group_chunks"]
        assert chunks == g["group_chunks"] and all(t in chunks for t in summaries[g["group_id"]]["tables"])
    handle = run.xcom("stream")
    assert handle["launched"] and handle["running"] and not handle["from_checkpoint"]
    assert run.task_states[("wait_caught_up", -1)] == "success"
    verified = run.xcom("verify")  # compared under the writer: every chunk equal, changed rows left out
    assert run.task_states[("verify", -1)] == "success" and verified["ok"], verified
    assert sorted(t["table"] for t in verified["tables"]) == sorted(first)
    assert all(t["chunks"] >= 2 and t["source_rows"] > ROWS // 2 for t in verified["tables"]), verified
    _catch_up_and_compare(pipeline, first)


def test_adding_a_table_snapshots_only_that_table(pipeline: dict) -> None:
    store = _store(pipeline)
    old_run = stream_state(store)["run_id"]
    tables = pipeline["tables"]
    run = _run_under_writer(pipeline, {"tables": tables}, seed=12)
    assert run.state == "success", run.task_states
    assert run.task_states[("verify", -1)] == "skipped"  # the verify param is off by default
    summary = run.xcom("plan", key="plan_summary")
    assert summary["snapshot_tables"] == [tables[2]]
    assert summary["unchanged_tables"] == tables[:2]
    assert summary["stopped_stream"] is False  # the stream kept the old tables current meanwhile
    summaries = run.mapped_xcoms("snapshot")
    assert summaries and all(s["tables"] == [tables[2]] for s in summaries)
    plan_id = run.xcom("plan", key="plan_id")
    assert {r.table for r in store.read_all_results(plan_id)} == {tables[2]}  # old tables not re-read
    handle = run.xcom("stream")
    assert handle["reloaded"] and handle["run_id"] == old_run  # paused and resumed, not relaunched
    assert handle["plan"]["reloaded"] is True
    manifest = store.read_json("manifest.json")
    assert set(manifest["tables"]) == set(tables)
    # The stream ran on (the writer kept it busy) while t_ci was snapshotted, so it hands over in a
    # new generation starting at t_ci's earliest HW; the old tables' chunks filter out what the old
    # generation applied.
    assert handle["plan"]["new_generation"] == 1, handle
    assert manifest["checkpoint"] == "checkpoint-g1"
    new_hws = [BinlogOffset.from_dict(s["high_watermark"]) for s in manifest["tables"][tables[2]]["splits"]]
    assert BinlogOffset.from_dict(manifest["start_offset"]) == min(new_hws)
    p = BinlogOffset.from_dict(handle["plan"]["checkpoint_offset"])
    assert min(new_hws) < p
    for t in tables[:2]:
        assert all(BinlogOffset.from_dict(s["high_watermark"]) >= p for s in manifest["tables"][t]["splits"])
    _catch_up_and_compare(pipeline, tables)


def test_resnapshot_replaces_a_damaged_table(pipeline: dict) -> None:
    from deltalake import DeltaTable

    store, tables = _store(pipeline), pipeline["tables"]
    sink = DeltaSink(pipeline["conf"]["sink_root"])
    damaged = tables[1]  # t_comp
    dt = DeltaTable(sink.table_uri(damaged))
    dt.delete("n % 7 = 0")
    dt.update(updates={"v": "-1"}, predicate="n % 5 = 0")
    with pipeline["settings"].connect() as conn:
        assert not compare(conn, read_table_schema(conn, TableId.parse(damaged)), sink.read(damaged)).match
    versions_before = {t: DeltaTable(sink.table_uri(t)).version() for t in tables}

    run_id = stream_state(store)["run_id"]
    run = _run_under_writer(pipeline, {"tables": tables, "resnapshot_tables": [damaged]}, seed=13)
    assert run.state == "success", run.task_states
    summary = run.xcom("plan", key="plan_summary")
    assert summary["snapshot_tables"] == [damaged] and summary["resnapshot_tables"] == [damaged]
    assert summary["stopped_stream"] is False  # the stream kept every table current meanwhile
    handle = run.xcom("stream")
    assert handle["plan"]["resnapshotted"] == [damaged]
    assert handle["reloaded"] and handle["run_id"] == run_id
    history = DeltaTable(sink.table_uri(damaged)).history()
    swaps = [h for h in history if "re_snapshot" in json.dumps(h.get("mysqlcdc", h))]
    assert swaps, "the backfill swaps the table in with one commit"
    for t in tables:
        if t != damaged:  # only stream MERGEs touched the others, never a snapshot commit
            newer = [h for h in DeltaTable(sink.table_uri(t)).history() if h["version"] > versions_before[t]]
            assert all("re_snapshot" not in json.dumps(h) for h in newer)
    _catch_up_and_compare(pipeline, tables)
    assert store.read_json("current_plan.json")["finalized"] is True


def test_retrigger_with_nothing_new_leaves_the_stream_running(pipeline: dict) -> None:
    """Re-running the DAG is safe: zero mapped snapshot tasks, the stream is left as it is."""
    before = stream_state(_store(pipeline))
    assert before["running"]
    run = run_dag(pipeline["dag"], {**pipeline["conf"], "tables": pipeline["tables"]})
    assert run.state == "success", run.task_states
    assert run.xcom("plan") == []
    assert run.xcom("plan", key="plan_summary")["unchanged_tables"] == pipeline["tables"]
    assert ("snapshot", 0) not in run.task_states
    handle = run.xcom("stream")
    assert handle["already_running"] is True and handle["run_id"] == before["run_id"]
    assert run.task_states[("wait_caught_up", -1)] == "success"
    assert stream_state(_store(pipeline))["run_id"] == before["run_id"]


def test_latest_offset_mode_captures_changes_from_now_on(pipeline: dict, tmp_path: Path) -> None:
    """startup_mode=latest-offset: no snapshot; exactly the rows changed after the run are captured."""
    server = pipeline["server"]
    server.execute(
        "CREATE TABLE cdc.events (id INT NOT NULL PRIMARY KEY, v VARCHAR(20))",
        "INSERT INTO cdc.events SELECT seq, 'old' FROM seq_1_to_100",
        database=DB,
    )
    conf = {
        **pipeline["conf"], "pipeline_id": "live", "tables": ["cdc.events"], "startup_mode": "latest-offset",
        "sink_root": str(tmp_path / "lake"), "state_root": str(tmp_path / "state"),
    }
    store = StateStore(conf["state_root"], "live")
    try:
        run = run_dag(pipeline["dag"], conf)
        assert run.state == "success", run.task_states
        assert run.xcom("plan") == [] and run.xcom("plan", key="plan_summary")["offset_tables"] == ["cdc.events"]
        server.execute(
            "INSERT INTO cdc.events SELECT seq, 'new' FROM seq_101_to_150",
            "UPDATE cdc.events SET v = 'changed' WHERE id <= 5",
            "DELETE FROM cdc.events WHERE id = 150",
            database=DB,
        )
        with pipeline["settings"].connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=180)
        rows = DeltaSink(conf["sink_root"]).read("cdc.events").to_pylist()
        got = sorted((r["id"], r["v"]) for r in rows)
        assert got == sorted([(i, "changed") for i in range(1, 6)] + [(i, "new") for i in range(101, 150)])
    finally:
        from airflow_provider_mysqlcdc.stream.control import request_stop

        request_stop(store, timeout=60)


def test_status_and_stop_cli(pipeline: dict) -> None:
    env = {**os.environ}
    cmd = [sys.executable, "-m", "airflow_provider_mysqlcdc"]
    args = ["--pipeline", PIPELINE, "--state-root", pipeline["conf"]["state_root"]]
    out = subprocess.run([*cmd, "status", *args], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["stream_running"] is True
    assert status["server_offset"] and status["committed_offset"]
    assert status["current_plan"]["airflow_run_id"].startswith("manual__")  # plan <-> DAG run
    assert set(status["tables"]) == set(pipeline["tables"])
    assert set(status["tables"].values()) == {"streaming"}

    # the DAG's environment variable is the CLI's default too; an unknown pipeline exits 1, saying what is there
    with_env = {**env, "MYSQLCDC_STATE_ROOT": pipeline["conf"]["state_root"]}
    out = subprocess.run([*cmd, "status", "--pipeline", PIPELINE], env=with_env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0 and json.loads(out.stdout)["stream_running"] is True, out.stderr
    out = subprocess.run([*cmd, "status", "--pipeline", "shpo"], env=with_env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert "error: no pipeline 'shpo' under state root" in out.stderr and "(did you mean 'shop'?)" in out.stderr

    out = subprocess.run([*cmd, "stop", *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    stopped = json.loads(out.stdout)
    assert stopped["stopped"] is True and stopped["state"] == "stopped"
    run = _store(pipeline).read_json("stream/run.json")
    assert run["state"] == "stopped"
    status = json.loads(subprocess.run([*cmd, "status", *args], env=env, capture_output=True, text=True).stdout)
    assert status["stream_running"] is False
    assert set(status["tables"].values()) == {"captured (stream stopped)"}


def test_attached_mode_runs_the_stream_in_the_task_until_stopped(pipeline: dict) -> None:
    """stream_mode=attached: the task is the stream (resumed from its checkpoint); a stop ends the task."""
    from airflow_provider_mysqlcdc.operators import MySqlCdcStreamOperator
    from airflow_provider_mysqlcdc.stream.control import checkpoint_offset, request_stop

    store = _store(pipeline)
    assert not stream_state(store)["running"]  # stopped by the previous test
    ckpt = checkpoint_offset(store)
    op = MySqlCdcStreamOperator(
        task_id="stream", pipeline_id=PIPELINE, sink_root=pipeline["conf"]["sink_root"],
        state_root=pipeline["conf"]["state_root"], plan_id=store.read_json("current_plan.json")["plan_id"],
        stream_mode="attached",
    )
    th = BackgroundCall(lambda: op.execute({"run_id": "manual__attached"}))
    th.start()
    deadline = time.monotonic() + 180
    while not stream_state(store)["running"] and th.is_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stream_state(store)["running"], th.error
    assert th.is_alive()  # the task holds the stream
    pipeline["server"].execute("UPDATE t_int SET v = v + 1000 WHERE id <= 20", database=DB)
    _catch_up_and_compare(pipeline, pipeline["tables"])
    stopped = request_stop(store, timeout=120)
    assert stopped["stopped"] is True
    th.join(timeout=120)
    assert not th.is_alive() and th.error is None, th.error
    result = th.result
    assert result["launched"] and result["from_checkpoint"] and result["final_state"] == "stopped"
    assert BinlogOffset.from_dict(result["start_offset"]) == ckpt


def test_bad_params_are_refused_before_any_spark_job(pipeline: dict) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = pipeline["dag"]
    base = {**pipeline["conf"], "pipeline_id": "bad", "tables": ["cdc.t_int"]}
    with pytest.raises(ParamValidationError, match="chunk_key_columns"):
        run_dag(dag, {**base, "chunk_key_columns": {"cdc.t_int": []}})
    with pytest.raises(ParamValidationError, match="startup_mode"):
        run_dag(dag, {**base, "startup_mode": "sometimes"})
    with pytest.raises(ParamValidationError, match="schema_change_policy"):
        run_dag(dag, {**base, "schema_change_policy": "ignore-everything"})
    with pytest.raises(ParamValidationError, match="routes"):  # a route needs both source and target
        run_dag(dag, {**base, "routes": [{"source": "cdc.t_*"}]})
    for conf in ({"tables": ["cdc.no_such_table"]}, {"chunk_size": 0}):  # no silent clamping of 0 to 1
        run = run_dag(dag, {**base, **conf})
        assert run.state == "failed"
        assert run.task_states[("plan", -1)] == "failed"
        assert run.task_states[("snapshot", -1)] == "upstream_failed"
        assert not StateStore(pipeline["conf"]["state_root"], "bad").exists("plans")


def test_a_typo_in_the_conf_is_refused_naming_the_param(pipeline: dict, capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 33 item 3: {"tabels": [...]} ran the default tables. Now the plan task fails at once (no
    Spark job, nothing in the state store) naming the closest param and every param; the stop DAG too."""
    base = {**pipeline["conf"], "pipeline_id": "typo"}
    capfd.readouterr()
    run = run_dag(pipeline["dag"], {**base, "tabels": ["cdc.t_ci"]})
    out = "".join(capfd.readouterr())
    assert run.state == "failed" and run.task_states[("plan", -1)] == "failed", run.task_states
    assert run.task_states[("snapshot", -1)] == "upstream_failed"
    assert not StateStore(pipeline["conf"]["state_root"], "typo").exists("plans")
    assert "the run's conf has 'tabels' (did you mean 'tables'?), which is not a param of DAG mysql_cdc" in out
    assert "Trigger it again with the keys spelled as its params: allow_large_plan, backfill_tables," in out

    stop = run_dag(load_dag("mysql_cdc_stop"), {"pipeline_id": "typo", "state_rot": "/tmp/elsewhere"})
    out = "".join(capfd.readouterr())
    assert stop.state == "failed" and stop.task_states[("stop_stream", -1)] == "failed", stop.task_states
    assert "'state_rot' (did you mean 'state_root'?)" in out and "pipeline_id, state_root, storage_conn_id" in out


def test_an_unwritable_sink_root_fails_the_plan_at_once(pipeline: dict, tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Issue 33 item 6: sink_root=/proc/... passed the plan and would fail only inside a Spark job. Now
    the plan task fails with no retry, before the source is asked, naming the root, the error and the fix."""
    (tmp_path / "a-file").write_text("not a directory")
    bad = str(tmp_path / "a-file" / "lake")
    conf = {**pipeline["conf"], "pipeline_id": "unwritable", "tables": ["cdc.t_int"], "sink_root": bad,
            "state_root": str(tmp_path / "state")}  # fmt: skip
    capfd.readouterr()
    run = run_dag(pipeline["dag"], conf)
    out = "".join(capfd.readouterr())
    assert run.state == "failed" and run.task_states[("plan", -1)] == "failed", run.task_states
    assert run.task_states[("snapshot", -1)] == "upstream_failed"
    assert f"sink_root {bad!r} is not writable (NotADirectoryError" in out
    assert "Fix: give sink_root a directory this user can create and write" in out
    assert not StateStore(conf["state_root"], "unwritable").exists("plans")


def test_plan_operator_explains_bad_values(pipeline: dict) -> None:
    """Operators used outside the example DAG (no JSON schema) check the same things themselves."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_mysqlcdc.operators import MySqlCdcPlanOperator

    op = MySqlCdcPlanOperator(
        task_id="plan", pipeline_id="bad", sink_root="/tmp/x", state_root="/tmp/y",
        tables=["cdc.t_int", "nodot"], chunk_size=0, startup_mode="sometimes", resnapshot_tables=["cdc.other"],
    )
    with pytest.raises(AirflowFailException) as exc:
        op.execute({"run_id": "manual__x"})
    msg = str(exc.value)
    for fragment in ("chunk_size must be >= 1", "startup_mode 'sometimes'", "'nodot' is not a table name",
                     "resnapshot_tables ['cdc.other'] are not in tables"):
        assert fragment in msg, msg
    assert not Path("/tmp/y/bad").exists()


def test_form_chunk_key_for_a_table_without_primary_key(pipeline: dict, tmp_path: Path) -> None:
    """The trigger form's chunk_key_columns param captures a table with no primary key; the old
    backfill_tables name is still accepted (with a deprecation note in the plan task's log)."""
    server = pipeline["server"]
    server.execute(
        "CREATE TABLE cdc.nopk (event_id BIGINT NOT NULL, v VARCHAR(20), UNIQUE KEY (event_id))",
        "INSERT INTO cdc.nopk SELECT seq, CONCAT('e', seq) FROM seq_1_to_3000",
        database=DB,
    )
    conf = {**pipeline["conf"], "pipeline_id": "nopk", "tables": ["cdc.nopk"], "startup_mode": "snapshot-only",
            "sink_root": str(tmp_path / "lake"), "state_root": str(tmp_path / "state"), "chunk_size": 500}  # fmt: skip
    run = run_dag(pipeline["dag"], conf)
    assert run.state == "failed" and run.task_states[("plan", -1)] == "failed"  # no key: refused, names the param
    run = run_dag(pipeline["dag"], {**conf, "chunk_key_columns": {"cdc.nopk": ["event_id"]}})
    assert run.state == "success", run.task_states
    rows = DeltaSink(conf["sink_root"]).read("cdc.nopk").to_pylist()
    assert sorted(r["event_id"] for r in rows) == list(range(1, 3001))
    run = run_dag(pipeline["dag"], {**conf, "chunk_key_columns": {"cdc.nopk": ["event_id"]},
                                     "backfill_tables": ["cdc.nopk"]})  # fmt: skip
    assert run.state == "success", run.task_states
    assert run.xcom("plan", key="plan_summary")["resnapshot_tables"] == ["cdc.nopk"]
    assert any("deprecated" in n for n in run.xcom("plan", key="plan_summary")["notes"])


def test_form_routes_shards_into_one_table(pipeline: dict, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                           caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """The trigger form's routes param: four shards snapshotted by mapped tasks into one Delta table
    whose source columns tell the shards apart (the same ids in every shard). A view the pattern
    matches is skipped, and that note, like the route's, is logged once (issue 33 item 8g: twice)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    server = pipeline["server"]
    shards = [(d, t) for d in ("cdc_r0", "cdc_r1") for t in ("orders_0", "orders_1")]
    for d in ("cdc_r0", "cdc_r1"):
        server.execute(f"CREATE DATABASE {d}")
    for d, t in shards:
        server.execute(f"CREATE TABLE {t} (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(30))",
                       f"INSERT INTO {t} SELECT seq, CONCAT('{d}.{t}-', seq) FROM seq_1_to_1500",
                       database=d)  # fmt: skip
    server.execute("CREATE VIEW orders_view AS SELECT id FROM orders_0", database="cdc_r0")
    conf = {**pipeline["conf"], "pipeline_id": "routed", "tables": ["cdc_r?.orders_*"], "chunk_size": 500,
            "routes": [{"source": r"cdc_r[0-9]\.orders_[0-9]", "target": "cdc.all_orders"}],
            "startup_mode": "snapshot-only", "sink_root": str(tmp_path / "lake"),
            "state_root": str(tmp_path / "state")}  # fmt: skip
    capfd.readouterr()
    caplog.clear()
    run = run_dag(pipeline["dag"], conf)
    # the task log, as dag.test() under pytest splits it: the operators' loggers print to stdout, the
    # provider's module loggers (pipeline.plan_run) reach pytest's log capture
    out = "".join(capfd.readouterr()) + caplog.text
    assert run.state == "success", run.task_states
    assert len(run.xcom("plan")) >= 2  # mapped snapshot tasks, each committing shards into the one table
    notes = run.xcom("plan", key="plan_summary")["notes"]
    assert any("route cdc.all_orders: 4 table(s)" in n for n in notes)
    skipped = [n for n in notes if n.startswith("skipped cdc_r0.orders_view: a view")]
    assert len(skipped) == 1, notes
    for note in [skipped[0], next(n for n in notes if "route cdc.all_orders" in n)]:
        assert out.count(note) == 1, (note, out.count(note))
    assert "pipeline routed: snapshot cdc_r0.orders_0, cdc_r0.orders_1, cdc_r1.orders_0, cdc_r1.orders_1" in out
    dt = DeltaTable(f"{conf['sink_root']}/cdc/all_orders")
    rows = QueryBuilder().register("t", dt).execute("SELECT _source_database, _source_table, id, v FROM t").read_all()
    got = sorted(tuple(r.values()) for r in pa.table(rows).to_pylist())
    assert got == sorted((d, t, i, f"{d}.{t}-{i}") for d, t in shards for i in range(1, 1501))
    assert dt.metadata().partition_columns == ["_source_database", "_source_table"]


def test_form_pattern_captures_a_database_while_tables_come_and_go(pipeline: dict, tmp_path: Path) -> None:
    """Issue 13's whole-database scenario through the example DAG (tests/integration/test_whole_database.py
    runs the same in-process on 200 tables, with finer checks): tables=['<db>.*'] plans 48 tables (three key
    kinds; the scale is the in-process test's, the DAG path is this one's) and snapshots them in mapped
    tasks while a writer changes all of them; the detached stream then
    captures 4 tables created meanwhile from their CREATE (a keyless one refused), follows a DROP and a
    DROP + CREATE again under the lenient policy — and every captured table equals its source (the
    same DDL and checks as there: ``tables_come_and_go``, ``assert_captured_as_the_source``)."""
    from airflow_provider_mysqlcdc.stream.control import request_stop
    from tests.integration.test_whole_database import (
        Writer,
        _create,
        _kind,
        assert_captured_as_the_source,
        tables_come_and_go,
    )

    server, db = pipeline["server"], "cdc_wd"
    server.execute(f"CREATE DATABASE {db}")
    names = [f"t{i:03d}" for i in range(48)]  # tables_come_and_go drops and re-creates some of t000-t020
    server.execute(*[s for n in names for s in _create(n, _kind(n))], database=db)
    server.execute("CREATE VIEW v_all AS SELECT id FROM t000", database=db)
    conf = {**pipeline["conf"], "pipeline_id": "wholedb", "tables": [f"{db}.*"], "exclude_tables": [f"{db}.skip_*"],
            "chunk_size": 100, "chunks_per_task": 16, "schema_change_policy": "lenient",
            "sink_root": str(tmp_path / "lake"), "state_root": str(tmp_path / "state")}  # fmt: skip
    store, sink = StateStore(conf["state_root"], "wholedb"), DeltaSink(conf["sink_root"])
    writer = Writer(server, db, names)
    writer.start()
    try:
        run = run_dag(pipeline["dag"], conf)
        assert run.state == "success", run.task_states
        assert len(run.xcom("plan")) >= 2 and run.xcom("stream")["running"]
        summary = run.xcom("plan", key="plan_summary")
        assert any("v_all" in n for n in summary["notes"])  # a view matches the pattern: reported, skipped
        tables_come_and_go(writer)
        time.sleep(3)
        writer.stop_event.set()
        writer.join(timeout=30)
        assert writer.statements > 300
        with pipeline["settings"].connect() as conn:
            target = current_offset(conn)
        wait_until_applied(store, target, timeout=300)

        assert_captured_as_the_source(pipeline["settings"], store, sink, db, names)
    finally:
        writer.stop_event.set()
        request_stop(store, timeout=60)


def test_source_conn_id_captures_from_that_connection(pipeline: dict, mariadb: Any, db: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Issue 33 item 5: one DAG, a second source. The table exists only on the second server (the
    session's shared MariaDB), so a task that used the default connection (this module's server) would
    fail: the plan and the snapshot (no such table), verify (likewise), the stream (changes made on the
    second server after the run reach the lake only if it reads that server's binlog)."""
    from airflow_provider_mysqlcdc.stream.control import request_stop

    mariadb.execute("CREATE TABLE orders (id INT NOT NULL PRIMARY KEY, v VARCHAR(20))",
                    "INSERT INTO orders SELECT seq, CONCAT('o', seq) FROM seq_1_to_3000", database=db)  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_MYSQL_CDC_SECOND", mariadb.airflow_conn_json())
    table = f"{db}.orders"
    conf = {**pipeline["conf"], "pipeline_id": "second", "source_conn_id": "mysql_cdc_second", "tables": [table],
            "verify": True, "sink_root": str(tmp_path / "lake"), "state_root": str(tmp_path / "state")}  # fmt: skip
    store = StateStore(conf["state_root"], "second")
    settings = mariadb.cdc_settings()
    try:
        run = run_dag(pipeline["dag"], conf)
        assert run.state == "success", run.task_states
        assert {g["mysql_cdc_conn_id"] for g in run.xcom("plan")} == {"mysql_cdc_second"}  # the snapshot tasks'
        assert run.xcom("verify")["ok"] is True
        mariadb.execute("INSERT INTO orders VALUES (5001, 'new')", "UPDATE orders SET v = 'upd' WHERE id <= 10",
                        "DELETE FROM orders WHERE id = 3000", database=db)  # fmt: skip
        with settings.connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=180)
            cmp = compare(conn, read_table_schema(conn, TableId.parse(table)), DeltaSink(conf["sink_root"]).read(table))
        assert cmp.match and cmp.source_rows == 3000, cmp
    finally:
        request_stop(store, timeout=60)
