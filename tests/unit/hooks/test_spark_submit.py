"""MySqlCdcSparkSubmitHook: the spark-submit command it builds and the detached submit, without Spark."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.hooks.spark_submit import (
    DEFAULT_JDBC_JAR,
    SOURCE_ENV,
    STORAGE_ENV,
    MySqlCdcSparkSubmitHook,
    SparkSetupError,
    job_env,
)
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from tests.support import fake_spark


@pytest.fixture(autouse=True)
def _conns(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_spark.install(tmp_path, monkeypatch)
    fake_spark.connections(monkeypatch)


def _opts(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


def test_local_master_gets_the_providers_defaults() -> None:
    hook = MySqlCdcSparkSubmitHook(jars="/opt/jdbc.jar", name="job", application_args=["--x", "1"])
    cmd = hook.spark_submit_command("/app/job.py")
    assert cmd[:3] == ["spark-submit", "--master", "local[2]"]
    assert _opts(cmd, "--conf") == [
        "spark.log.level=WARN",
        "spark.driver.extraJavaOptions=-XX:+ExitOnOutOfMemoryError",
        "spark.sql.session.timeZone=UTC",
    ]
    assert _opts(cmd, "--jars") == ["/opt/jdbc.jar"] and _opts(cmd, "--name") == ["job"]
    assert cmd[-3:] == ["/app/job.py", "--x", "1"]
    assert "s3cret-pw" not in " ".join(cmd)  # the source travels in the environment only
    assert hook.master == "local[2]" and hook.source.host == "db.example" and hook.source.port == 3307


def test_the_users_conf_wins_and_java_options_are_kept() -> None:
    hook = MySqlCdcSparkSubmitHook(
        jars="", conf={"spark.log.level": "INFO", "spark.driver.extraJavaOptions": "-Dx=1"}
    )
    cmd = hook.spark_submit_command("app.py")
    confs = _opts(cmd, "--conf")
    assert "spark.log.level=INFO" in confs and "spark.log.level=WARN" not in confs
    assert "spark.driver.extraJavaOptions=-Dx=1 -XX:+ExitOnOutOfMemoryError" in confs
    assert "--jars" not in cmd  # jars="" = the driver is on the cluster's classpath


def test_every_spark_submit_option_is_the_parents(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster: deploy mode from the connection, kerberos, proxy user, packages, sizes passed through."""
    fake_spark.connections(
        monkeypatch,
        spark=json.dumps({"conn_type": "spark", "host": "spark://master", "port": 7077,
                          "extra": {"deploy-mode": "client", "queue": "etl"}}),
    )
    hook = MySqlCdcSparkSubmitHook(
        principal="cdc@EXAMPLE", keytab="/k/cdc.keytab", proxy_user="etl", packages="io.delta:delta-spark_2.13:4.0.0",
        num_executors=3, executor_cores=2, executor_memory="2g", driver_memory="3g", verbose=True,
        env_vars={"TZ": "UTC"},
    )
    cmd = hook.spark_submit_command("app.py")
    assert _opts(cmd, "--master") == ["spark://master:7077"] and _opts(cmd, "--deploy-mode") == ["client"]
    assert _opts(cmd, "--principal") == ["cdc@EXAMPLE"] and _opts(cmd, "--keytab") == ["/k/cdc.keytab"]
    assert _opts(cmd, "--proxy-user") == ["etl"] and _opts(cmd, "--packages") == ["io.delta:delta-spark_2.13:4.0.0"]
    assert _opts(cmd, "--num-executors") == ["3"] and _opts(cmd, "--executor-cores") == ["2"]
    assert _opts(cmd, "--executor-memory") == ["2g"] and _opts(cmd, "--driver-memory") == ["3g"]
    assert "--verbose" in cmd and _opts(cmd, "--queue") == ["etl"]
    assert _opts(cmd, "--jars") == [DEFAULT_JDBC_JAR]  # not checked on this host: the cluster has it
    assert "spark.sql.session.timeZone=UTC" not in _opts(cmd, "--conf")  # local-only default


def test_a_missing_spark_connection_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
    with pytest.raises(SparkSetupError, match="AIRFLOW_CONN_SPARK_DEFAULT"):
        MySqlCdcSparkSubmitHook()


def test_the_job_environment_carries_the_source_and_local_python() -> None:
    source = ConnectionSettings(host="h", port=3306, user="u", password="pw")
    env = job_env(source, {"EXTRA": "1"}, "local[*]")
    assert ConnectionSettings.from_dict(json.loads(env[SOURCE_ENV])) == source
    assert env["EXTRA"] == "1" and env["PYSPARK_PYTHON"] == os.environ.get("PYSPARK_PYTHON", sys.executable)
    assert "PYSPARK_PYTHON" not in job_env(source, None, "yarn")


def test_detached_submit_returns_at_once_in_its_own_session(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    hook = MySqlCdcSparkSubmitHook(jars="", application_args=["--a"], detach_log=str(log))
    assert hook.submit("app.py") is None
    proc = hook.process
    assert proc is not None and proc.wait(timeout=30) == 0
    out = log.read_text()
    assert json.loads(fake_spark.printed(out, "ARGS"))[-2:] == ["app.py", "--a"]
    assert json.loads(fake_spark.printed(out, "SOURCE"))["password"] == "s3cret-pw"
    assert int(fake_spark.printed(out, "SID")) == proc.pid != os.getsid(0)  # outlives the task's session


def test_attached_submit_is_the_parents(tmp_path: Path) -> None:
    hook = MySqlCdcSparkSubmitHook(jars="")
    t0 = time.monotonic()
    hook.submit("app.py")  # waits for spark-submit and checks its exit code
    assert hook.process is not None and hook.process.returncode == 0 and time.monotonic() - t0 < 30


@pytest.mark.parametrize("master", ["yarn", "k8s://https://kube:6443"])
def test_secrets_never_become_confs_on_yarn_or_kubernetes(monkeypatch: pytest.MonkeyPatch, master: str) -> None:
    """The parent hook turns env_vars into --conf spark.yarn.appMasterEnv.* / spark.kubernetes.driverEnv.*
    on these masters (argv, Spark UI). In client mode the secrets go to spark-submit's own environment."""
    _without_kubernetes_client(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_LAKE", json.dumps(
        {"conn_type": "aws", "login": "AKIAX", "password": "lake-s3cret-key", "extra": {"region_name": "eu-west-1"}}
    ))  # fmt: skip
    host, _, port = master.rpartition(":") if master.startswith("k8s") else (master, "", "")
    fake_spark.connections(monkeypatch, spark=json.dumps(
        {"conn_type": "spark", "host": host, **({"port": int(port)} if port else {}),
         "extra": {"deploy-mode": "client"}}
    ))  # fmt: skip
    hook = MySqlCdcSparkSubmitHook(storage_conn_id="aws_lake", env_vars={"TZ": "UTC"})
    cmd = " ".join(hook.spark_submit_command("app.py"))
    assert "s3cret-pw" not in cmd and "lake-s3cret-key" not in cmd and "MYSQLCDC_" not in cmd
    assert "TZ=UTC" in cmd  # the user's own env_vars are still the parent's business
    env = hook._env or {}
    assert json.loads(env[SOURCE_ENV])["password"] == "s3cret-pw"
    assert json.loads(env[STORAGE_ENV])["aws_secret_access_key"] == "lake-s3cret-key"


def test_cluster_mode_on_kubernetes_needs_the_secrets_from_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_kubernetes_client(monkeypatch)
    fake_spark.connections(monkeypatch, spark=json.dumps(
        {"conn_type": "spark", "host": "k8s://https://kube", "port": 6443, "extra": {"deploy-mode": "cluster"}}
    ))  # fmt: skip
    with pytest.raises(SparkSetupError, match=r"spark\.kubernetes\.driver\.secretKeyRef\.MYSQLCDC_SOURCE=<secret>"):
        MySqlCdcSparkSubmitHook()
    hook = MySqlCdcSparkSubmitHook(conf={"spark.kubernetes.driver.secretKeyRef.MYSQLCDC_SOURCE": "cdc:source"})
    cmd = " ".join(hook.spark_submit_command("app.py"))
    assert "s3cret-pw" not in cmd and "secretKeyRef.MYSQLCDC_SOURCE=cdc:source" in cmd
    assert SOURCE_ENV not in (hook._env or {})


def test_cluster_mode_on_yarn_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_spark.connections(monkeypatch, spark=json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}
    ))  # fmt: skip
    with pytest.raises(SparkSetupError, match="client deploy mode on YARN"):
        MySqlCdcSparkSubmitHook()


def _without_kubernetes_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Spark provider wants the Kubernetes provider's client for a k8s master; only commands are built here."""
    import airflow.providers.apache.spark.hooks.spark_submit as parent

    monkeypatch.setattr(parent, "kube_client", object(), raising=False)


def test_a_detached_stream_in_cluster_mode_only_submits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In cluster deploy mode the driver runs on the cluster: spark-submit must return once it is accepted
    (so the task's worker can go away), and the launcher then waits for the run record alone."""
    _without_kubernetes_client(monkeypatch)
    fake_spark.connections(monkeypatch, spark=json.dumps(
        {"conn_type": "spark", "host": "k8s://https://kube", "port": 6443, "extra": {"deploy-mode": "cluster"}}
    ))  # fmt: skip
    conf = {"spark.kubernetes.driver.secretKeyRef.MYSQLCDC_SOURCE": "cdc:MYSQLCDC_SOURCE"}
    hook = MySqlCdcSparkSubmitHook(conf=conf, detach_log=str(tmp_path / "driver.log"))
    assert hook.cluster_deploy_mode
    assert "spark.kubernetes.submission.waitAppCompletion=false" in _opts(hook.spark_submit_command("a.py"), "--conf")
    attached = MySqlCdcSparkSubmitHook(conf=conf)
    assert not any("waitAppCompletion" in c for c in _opts(attached.spark_submit_command("a.py"), "--conf"))


class _Logger:
    """Stands for the hook's logger: records (method, message) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, method: str):  # type: ignore[no-untyped-def]
        return lambda msg, *args, **kwargs: self.calls.append((method, msg % args if args else msg))


def test_spark_submit_output_keeps_each_lines_level() -> None:
    """The parent logs every line of spark-submit's output at INFO; a Spark ERROR must stay an error
    in the task log, with its stack trace, and Python logging's lines keep theirs too."""
    hook = MySqlCdcSparkSubmitHook(jars="")
    logger = hook._log = _Logger()
    hook._process_spark_submit_log(iter([
        "26/11/27 21:29:15 INFO Executor: Fetching spark://192.0.2.2:34099/jars/mariadb-java-client.jar\n",
        "26/11/27 21:30:38 WARN TaskSetManager: Lost task 0.0 in stage 1.0: 50% done\n",
        "26/11/27 21:30:39 ERROR MicroBatchExecution: Query q terminated with error\n",
        "java.lang.IllegalStateException: boom\n",
        "\tat org.apache.spark.Foo.bar(Foo.scala:1)\n",
        "Caused by: java.io.IOException: disk full\n",
        "2026-11-27 21:30:40,001 INFO airflow_provider_mysqlcdc.stream.job: stream p started\n",
        "2026-11-27 21:30:41,002 ERROR airflow_provider_mysqlcdc.jobs.stream: the stream failed: boom\n",
        "[Stage 0:>                                                          (0 + 1) / 5]\n",
        "error: environment variable MYSQLCDC_SOURCE with the source connection JSON is not set\n",
        "MYSQLCDC_RESULT {\"stopped\": true}\n",
    ]))  # fmt: skip
    assert [m for m, _ in logger.calls] == [
        "info", "warning", "error", "error", "error", "error", "info", "error", "info", "error", "info",
    ]  # fmt: skip
    assert logger.calls[1][1].endswith("50% done")  # a line is logged as it is, never %-formatted
    assert hook.log is logger  # the hook's own logger again afterwards
