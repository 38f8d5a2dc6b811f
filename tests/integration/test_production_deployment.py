"""Issue 12's acceptance: the example DAG on a production-shaped deployment, end to end.

Everything is real and runs as separate processes, as in production: an Airflow (scheduler,
dag-processor, triggerer, api-server; LocalExecutor, SQLite) with its connections in the
environment, a Spark standalone cluster (master + two 1-core workers), an S3 server (moto) holding
the lake and the pipeline state, and a private MariaDB under a random writer. The tests share one
pipeline and run in order:

1. Airflow is healthy and has parsed the example DAG without import errors;
   both example DAGs run from the conf their trigger forms send at their defaults (a UI user who
   changes nothing: a local lake from ``MYSQLCDC_*`` defaults, cluster settings from Spark's
   ``spark-defaults.conf``): ``mysql_cdc`` snapshots and streams, ``mysql_cdc_stop`` stops it;
2. runs are triggered through the REST API as the UI's trigger form does (conf = the DAG's params):
   the first run (mapped snapshot tasks overlapping in time, one Spark application each, then the
   detached stream and the deferred catch-up sensor), an add-table run (only the new table read)
   and a re-snapshot run; after each, every Delta table read from S3 equals its source;
3. during the re-snapshot run an executor JVM of a running snapshot application is killed with
   SIGKILL: the run still succeeds and the table is exact (no lost row, no duplicate);
4. a detached stream outlives the process that launched it: the launcher is killed (its whole
   process group) as soon as spark-submit has started, and the stream runs and applies on;
5. while the stream runs on the cluster, neither the MySQL password nor the S3 secret key appears
   in any process's argv, the stream's Spark environment page, the Spark event logs, Airflow's
   task logs or the detached stream's driver log.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.storage import LakeStorage
from airflow_provider_mysqlcdc.stream.control import request_stop, stream_state, wait_until_applied
from tests.support.airflow_env import REPO
from tests.support.airflow_services import AirflowServices
from tests.support.background import BackgroundCall
from tests.support.mariadb import CDC_GRANTS, free_port
from tests.support.random_writer import RandomWriter, make_tables
from tests.support.secret_scan import scan_directory, scan_processes, scan_spark_environment
from tests.support.trigger_form import default_conf, required_but_empty
from tests.support.verify import compare

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DAG_ID = "mysql_cdc"
DB = "shop"
ROWS = 6_000
# ~7 chunks a table, all of a table in one group: the first run (2 tables) has 2 mapped snapshot
# groups. More groups prove no more and cost a driver JVM each: 4 groups (4 chunks a task) made the
# first run 5.5 min instead of ~3 on this 2-core machine.
CHUNK = 1_000
PER_TASK = 8
WRITE_RATE = 60.0
DEFAULT_PIPELINE = "shop"  # the example DAG's default pipeline_id
UI_PORT_RETRIES = 16  # spark.port.maxRetries: drivers of one conf take ui_port, ui_port + 1, ...


@pytest.fixture(scope="module")
def deploy(private_server: Any, s3_server: Any, spark_cluster: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, Any]]:  # fmt: skip
    work = tmp_path_factory.mktemp("deploy")
    private_server.execute(f"CREATE DATABASE {DB}")
    tables = make_tables(private_server, DB, rows=ROWS)
    # A CDC user of its own with a random password: the secret scan looks for it in every process
    # on the machine, where other tests' fixed "cdc-pass" could show up by accident.
    user, password = "cdc_deploy", "pw-" + secrets.token_urlsafe(18)
    private_server.execute(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'", f"GRANT {CDC_GRANTS} ON *.* TO '{user}'@'%'"
    )
    pipeline = "deploy-" + secrets.token_hex(3)
    s3 = s3_server.endpoint
    storage = LakeStorage(s3_server.storage_options())
    aws_conn = {
        "conn_type": "aws", "login": s3.access_key_id, "password": s3.secret_access_key,
        "extra": {"endpoint_url": s3.endpoint_url, "region_name": s3.region},
    }  # fmt: skip
    # What a UI user who changes nothing gets: the DAG's defaults from MYSQLCDC_* (a local lake, no
    # storage connection), the cluster's settings from Spark's own spark-defaults.conf.
    defaults = {"sink_root": str(work / "default-lake"), "state_root": str(work / "default-state"),
                "tables": [f"{DB}.t_ci"]}  # fmt: skip
    spark_conf_dir = work / "spark-conf"
    spark_conf_dir.mkdir()
    cluster_defaults = {**spark_cluster.submit_conf(), "spark.cores.max": "1", "spark.executor.memory": "512m"}
    (spark_conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in cluster_defaults.items()))
    services = AirflowServices(
        work / "airflow-home",
        connections={
            "mysql_cdc_default": private_server.airflow_conn_json(user, password),
            "spark_default": json.dumps({"conn_type": "spark", "host": spark_cluster.master_url}),
            "aws_lake": json.dumps(aws_conn),
        },
        # the driver (client mode) binds where the cluster's URL points; spark-submit is next to the venv Python
        extra_env={"SPARK_LOCAL_IP": "127.0.0.1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                   "SPARK_CONF_DIR": str(spark_conf_dir), "MYSQLCDC_SINK_ROOT": defaults["sink_root"],
                   "MYSQLCDC_STATE_ROOT": defaults["state_root"], "MYSQLCDC_TABLES": ",".join(defaults["tables"])},
    )
    ui_port = free_port()
    # event log (uncompressed) into the cluster's dir, the venv's Python, fast JVMs, one core a job
    spark_conf = {**cluster_defaults, "spark.ui.port": str(ui_port)}
    ctx = {
        "server": private_server, "settings": private_server.cdc_settings(user, password), "password": password,
        "tables": tables, "pipeline": pipeline, "s3": s3_server, "storage": storage, "cluster": spark_cluster,
        "services": services, "ui_port": ui_port, "spark_conf": spark_conf,
        "conf": {
            "pipeline_id": pipeline, "sink_root": s3.url("lake"), "state_root": s3.url("state"),
            "storage_conn_id": "aws_lake", "chunk_size": CHUNK, "chunks_per_task": PER_TASK, "spark_conf": spark_conf,
        },
        "timings": {}, "defaults": defaults,
    }  # fmt: skip
    t0 = time.monotonic()
    services.start()
    ctx["timings"]["airflow_start"] = round(time.monotonic() - t0, 1)
    try:
        yield ctx
    finally:
        with contextlib.suppress(Exception):
            request_stop(_store(ctx), timeout=60)
        with contextlib.suppress(Exception):  # the default pipeline, if its test stopped half-way
            request_stop(StateStore(defaults["state_root"], DEFAULT_PIPELINE), timeout=60)
        services.stop()
        # a detached stream with a remote state store keeps its driver log on the launching machine
        shutil.rmtree(Path(tempfile.gettempdir()) / "mysqlcdc" / pipeline, ignore_errors=True)
        print("timings (s):", ctx["timings"])


def _store(d: dict[str, Any]) -> StateStore:
    return StateStore(d["conf"]["state_root"], d["pipeline"], d["storage"])


def _sink(d: dict[str, Any]) -> DeltaSink:
    return DeltaSink(d["conf"]["sink_root"], d["storage"])


def _catch_up_and_compare(d: dict[str, Any], tables: list[str]) -> None:
    with d["settings"].connect() as conn:
        target = current_offset(conn)
    wait_until_applied(_store(d), target, timeout=240)
    sink = _sink(d)
    with d["settings"].connect() as conn:
        for t in tables:
            cmp = compare(conn, read_table_schema(conn, TableId.parse(t)), sink.read(t))
            assert cmp.match, f"{t}: {cmp}"
            assert cmp.source_rows > ROWS // 2


def _run_under_writer(
    d: dict[str, Any], label: str, conf: dict[str, Any], seed: int, during: Any = None, after: float = 2.0
) -> tuple[str, str, Any]:
    """Trigger a run through the REST API under the random writer; (run id, final state, ``during``'s result)."""
    services: AirflowServices = d["services"]
    writer = RandomWriter(d["server"], DB, rate=WRITE_RATE, seed=seed, rows=ROWS)
    writer.start()
    side = None
    t0 = time.monotonic()
    try:
        time.sleep(0.5)
        run_id = services.trigger(DAG_ID, {**d["conf"], **conf})
        if during is not None:
            side = BackgroundCall(lambda: during(d, run_id))
            side.start()
        state = services.wait_run(DAG_ID, run_id, timeout=600)
        time.sleep(after)  # the stream applies changes made after the run finished
    finally:
        writer.stop_event.set()
        writer.join()
    d["timings"][label] = round(time.monotonic() - t0, 1)
    assert writer.transactions > 50, writer.transactions
    if side is not None:
        side.join(timeout=60)
    return run_id, state, side


def _parse(ts: str | None) -> datetime:
    assert ts, "a task instance without start/end date"
    return datetime.fromisoformat(ts)


@pytest.mark.timeout(600)
def test_airflow_components_are_up_and_parse_the_dag(deploy: dict[str, Any]) -> None:
    services: AirflowServices = deploy["services"]
    with services.logs_on_failure():
        health = services.api("GET", "/monitor/health")
        for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
            assert health[part]["status"] == "healthy", health
        dag = services.wait_dag(DAG_ID)
        assert dag["is_paused"] is True  # a new DAG starts paused: the test unpauses it through the API
        assert services.unpause(DAG_ID)["is_paused"] is False
        params = services.api("GET", f"/dags/{DAG_ID}/details")["params"]
        assert set(deploy["conf"]) <= set(params)  # the conf sent below is exactly the trigger form's params


@pytest.mark.timeout(600)
def test_example_dags_run_with_the_trigger_forms_defaults(deploy: dict[str, Any]) -> None:
    """Issue 33 item 1: a UI user who changes nothing can start a pipeline on a local lake and stop it.

    The conf sent is exactly what the trigger form sends (every param's default, as the details
    endpoint serves them: tests/support/trigger_form.py), and no field the form marks required is empty."""
    services: AirflowServices = deploy["services"]
    defaults = deploy["defaults"]
    store = StateStore(defaults["state_root"], DEFAULT_PIPELINE)
    with services.logs_on_failure():
        services.wait_dag("mysql_cdc_stop")
        services.unpause("mysql_cdc_stop")
        forms = {d: services.api("GET", f"/dags/{d}/details")["params"] for d in (DAG_ID, "mysql_cdc_stop")}
        for dag_id, params in forms.items():
            assert required_but_empty(params) == [], f"{dag_id}: the form would not trigger at its defaults"
        conf = default_conf(forms[DAG_ID])
        assert conf["storage_conn_id"] is None and conf["sink_root"] == defaults["sink_root"], conf
        run_id = services.trigger(DAG_ID, conf)
        state = services.wait_run(DAG_ID, run_id, timeout=600)
        assert state == "success", services.task_states(DAG_ID, run_id)
        summary = services.xcom(DAG_ID, run_id, "plan", key="plan_summary")
        assert summary["snapshot_tables"] == defaults["tables"], summary
        assert services.xcom(DAG_ID, run_id, "stream")["running"] is True
        table = defaults["tables"][0]
        with deploy["settings"].connect() as conn:
            wait_until_applied(store, current_offset(conn), timeout=240)
            sink_rows = DeltaSink(defaults["sink_root"]).read(table)
            cmp = compare(conn, read_table_schema(conn, TableId.parse(table)), sink_rows)
        assert cmp.match and cmp.source_rows > ROWS // 2, cmp

        stop_conf = default_conf(forms["mysql_cdc_stop"])
        assert stop_conf == {"pipeline_id": DEFAULT_PIPELINE, "state_root": defaults["state_root"],
                             "storage_conn_id": None}  # fmt: skip
        stop_id = services.trigger("mysql_cdc_stop", stop_conf)
        assert services.wait_run("mysql_cdc_stop", stop_id, timeout=300) == "success", services.task_states(
            "mysql_cdc_stop", stop_id)  # fmt: skip
        stopped = services.xcom("mysql_cdc_stop", stop_id, "stop_stream")
        assert stopped["stopped"] is True, stopped
        assert stream_state(store)["running"] is False and store.read_run().state == "stopped"


@pytest.mark.timeout(600)
def test_first_run_through_the_rest_api(deploy: dict[str, Any]) -> None:
    services: AirflowServices = deploy["services"]
    first = deploy["tables"][:2]  # t_int, t_comp
    with services.logs_on_failure():
        run_id, state, _ = _run_under_writer(deploy, "first run", {"tables": first}, seed=21)
        tis = services.task_instances(DAG_ID, run_id)
        assert state == "success", services.task_states(DAG_ID, run_id)
        snaps = [t for t in tis if t["task_id"] == "snapshot"]
        assert len(snaps) >= 2 and all(t["state"] == "success" for t in snaps), snaps
        windows = sorted((_parse(t["start_date"]), _parse(t["end_date"])) for t in snaps)
        overlapping = [(a, b) for i, a in enumerate(windows) for b in windows[i + 1 :] if b[0] < a[1]]
        assert overlapping, f"no two mapped snapshot tasks ran at the same time: {windows}"
        handle = services.xcom(DAG_ID, run_id, "stream")
        assert handle["launched"] and handle["running"], handle
        _catch_up_and_compare(deploy, first)


@pytest.mark.timeout(600)
def test_add_table_run_snapshots_only_the_new_table(deploy: dict[str, Any]) -> None:
    services: AirflowServices = deploy["services"]
    tables = deploy["tables"]
    with services.logs_on_failure():
        run_id, state, _ = _run_under_writer(deploy, "add-table run", {"tables": tables}, seed=22)
        assert state == "success", services.task_states(DAG_ID, run_id)
        summary = services.xcom(DAG_ID, run_id, "plan", key="plan_summary")
        assert summary["snapshot_tables"] == [tables[2]], summary
        store = _store(deploy)
        plan_id = services.xcom(DAG_ID, run_id, "plan", key="plan_id")
        assert {r.table for r in store.read_all_results(plan_id)} == {tables[2]}  # the old tables were not re-read
        _catch_up_and_compare(deploy, tables)


def _driver_ui(d: dict[str, Any], app_id: str) -> str | None:
    """The UI of the driver running ``app_id``: the drivers of this conf take ui_port, ui_port + 1, ..."""
    for port in range(d["ui_port"], d["ui_port"] + UI_PORT_RETRIES):
        url = f"http://127.0.0.1:{port}"
        try:
            with urllib.request.urlopen(f"{url}/api/v1/applications", timeout=2) as resp:
                if any(a["id"] == app_id for a in json.loads(resp.read())):
                    return url
        except (OSError, ValueError):
            continue
    return None


def _busy_executor(ui: str, app_id: str) -> bool:
    try:
        with urllib.request.urlopen(f"{ui}/api/v1/applications/{app_id}/executors", timeout=2) as resp:
            return any(e["id"] != "driver" and e.get("activeTasks", 0) > 0 for e in json.loads(resp.read()))
    except (OSError, ValueError):
        return False


def _kill_a_snapshot_executor(d: dict[str, Any], run_id: str, timeout: float = 300.0) -> dict[str, Any]:
    """SIGKILL the executor JVM of a running snapshot application while it runs a task."""
    cluster, services = d["cluster"], d["services"]
    prefix = f"mysqlcdc-snapshot-{d['pipeline']}-"
    uis: dict[str, str | None] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if services.run_state(DAG_ID, run_id) not in ("queued", "running"):
            break
        with contextlib.suppress(OSError, ValueError):
            for app in cluster.master_json().get("activeapps", []):
                if not str(app["name"]).startswith(prefix):
                    continue
                app_id = str(app["id"])
                pids = cluster.executor_pids(app_id)
                if not pids:
                    continue
                if uis.get(app_id) is None:
                    uis[app_id] = _driver_ui(d, app_id)
                if uis[app_id] and _busy_executor(uis[app_id], app_id):
                    os.kill(pids[0], signal.SIGKILL)
                    return {"app_id": app_id, "app_name": app["name"], "pid": pids[0]}
        time.sleep(0.1)
    return {}


@pytest.mark.timeout(600)
def test_resnapshot_run_survives_a_killed_executor(deploy: dict[str, Any]) -> None:
    services: AirflowServices = deploy["services"]
    tables, target = deploy["tables"], deploy["tables"][0]  # t_int: the writer's busiest table
    with services.logs_on_failure():
        run_id, state, killer = _run_under_writer(
            deploy,
            "re-snapshot run",
            {"tables": tables, "resnapshot_tables": [target]},
            seed=23,
            during=_kill_a_snapshot_executor,
        )
        assert state == "success", services.task_states(DAG_ID, run_id)
        assert killer.error is None, killer.error
        killed = killer.result
        assert killed, "no snapshot application had a busy executor to kill"
        print("killed executor:", killed)
        summary = services.xcom(DAG_ID, run_id, "plan", key="plan_summary")
        assert summary["snapshot_tables"] == [target] and summary["resnapshot_tables"] == [target], summary
        # the application really lost its executor (the event log says so), and went on
        text = "".join(p.read_text(errors="replace") for p in deploy["cluster"].event_log_files(killed["app_id"]))
        assert "SparkListenerExecutorRemoved" in text, "the killed executor's removal is not in the event log"
        deploy["timings"]["lost task in killed app"] = "ExecutorLostFailure" in text
        _catch_up_and_compare(deploy, tables)


@pytest.mark.timeout(480)
def test_detached_stream_outlives_its_killed_launcher(deploy: dict[str, Any]) -> None:
    services: AirflowServices = deploy["services"]
    store = _store(deploy)
    with services.logs_on_failure():
        stopped = request_stop(store, timeout=120)
        assert stopped["stopped"] is True, stopped
        old = store.read_handle()
        stream_ui = free_port()
        deploy["stream_ui_port"] = stream_ui
        cfg = {
            "pipeline_id": deploy["pipeline"], "state_root": deploy["conf"]["state_root"],
            "storage_conn_id": "aws_lake", "conf": {**deploy["spark_conf"], "spark.ui.port": str(stream_ui)},
        }  # fmt: skip
        log = services.home / "launcher.log"
        t0 = time.monotonic()
        with open(log, "wb") as out:
            launcher = subprocess.Popen(
                [sys.executable, "-m", "tests.support.launch_stream", json.dumps(cfg)], cwd=REPO,
                env={**services.env(), "PYTHONPATH": str(REPO)}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            while True:  # spark-submit has started once the launcher has recorded its handle
                handle = store.read_handle()
                if handle is not None and (old is None or handle.run_id != old.run_id):
                    break
                assert launcher.poll() is None, log.read_text(errors="replace")[-4000:]
                assert time.monotonic() - t0 < 180, "the launcher recorded no handle within 180 s"
                time.sleep(0.1)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=30)
        assert launcher.returncode == -signal.SIGKILL
        deploy["stream_handle"] = handle.to_dict()
        deploy["timings"]["launcher killed after"] = round(time.monotonic() - t0, 1)

        deadline = time.monotonic() + 180
        while True:  # the stream reports running though its launcher is gone
            run = store.read_run()
            if run is not None and run.run_id == handle.run_id and run.state == "running":
                break
            assert run is None or run.run_id != handle.run_id or run.state in ("starting", "running"), run
            assert time.monotonic() < deadline, f"the relaunched stream did not report running: {run}; log:\n" + (
                Path(handle.log_path).read_text(errors="replace")[-4000:] if handle.log_path else ""
            )
            time.sleep(0.5)
        os.kill(int(handle.launcher_pid), 0)  # spark-submit (the driver, client mode) is alive
        deploy["timings"]["stream running after"] = round(time.monotonic() - t0, 1)

        # it keeps applying: new writes reach the Delta tables
        deploy["server"].execute(
            "UPDATE t_int SET v = v + 1000, note = 'after-kill' WHERE id <= 50",
            "INSERT INTO t_ci VALUES ('after-kill-1', 1), ('after-kill-2', 2)",
            "DELETE FROM t_comp WHERE n <= 30",
            database=DB,
        )
        _catch_up_and_compare(deploy, deploy["tables"])
        st = stream_state(store)
        assert st["running"] and st["run_id"] == handle.run_id, st
        rows = _sink(deploy).read(deploy["tables"][0]).to_pylist()
        ((changed,),) = deploy["server"].query("SELECT COUNT(*) FROM t_int WHERE note = 'after-kill'", database=DB)
        assert changed > 0 and sum(r["note"] == "after-kill" for r in rows) == changed


@pytest.mark.timeout(120)
def test_no_secret_leaks_while_the_stream_runs(deploy: dict[str, Any]) -> None:
    services: AirflowServices = deploy["services"]
    cluster = deploy["cluster"]
    secrets_ = [deploy["password"], deploy["s3"].secret_access_key]
    store = _store(deploy)
    with services.logs_on_failure():
        st = stream_state(store)
        assert st["running"], st
        assert "stream_ui_port" in deploy, "needs the detached stream of the previous test"
        stream_apps = [a for a in cluster.master_json()["activeapps"] if str(a["name"]).startswith("mysqlcdc-stream-")]
        assert len(stream_apps) == 1, stream_apps
        app_id = str(stream_apps[0]["id"])
        stream_ui = f"http://127.0.0.1:{deploy['stream_ui_port']}"
        workers = [cluster.worker_dir(i) for i in range(cluster.workers)]
        findings = {
            "argv": scan_processes(secrets_),
            "spark environment": scan_spark_environment(secrets_, stream_ui, app_id),
            "event logs": scan_directory(secrets_, cluster.event_log_dir),
            "airflow task logs": scan_directory(secrets_, services.task_log_dir),
            "airflow service logs": scan_directory(secrets_, services.service_log_dir),
            "stream driver logs": scan_directory(secrets_, Path(deploy["stream_handle"]["log_path"]).parent),
            "spark worker dirs": [f for w in workers for f in scan_directory(secrets_, w)],
        }
        assert list(cluster.event_log_dir.rglob("*")), "no event log was written"
        assert list(services.task_log_dir.rglob("*.log")), "no task log was written"
        leaks = {k: [str(f) for f in v] for k, v in findings.items() if v}
        assert not leaks, leaks
