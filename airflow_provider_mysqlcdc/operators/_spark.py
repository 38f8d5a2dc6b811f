"""How the operators submit the provider's Spark jobs through the Spark provider's ``SparkSubmitHook``.

The ``spark_default`` connection decides where jobs run (``local[*]``, ``spark://``, YARN,
Kubernetes), so a DAG moves from a laptop to a cluster by changing a connection, not code. What
this module adds is what every job of this provider needs:

* the source connection as JSON in ``MYSQLCDC_SOURCE`` — an environment variable, never an
  argument (arguments show in ``ps`` and in Airflow's log of the command line);
* the MariaDB/MySQL JDBC driver jar (``jdbc_jar``; Debian's ``libmariadb-java`` by default);
* for local masters, the driver's and workers' Python = the Python running Airflow, which has this
  provider, pyarrow and deltalake installed (otherwise Spark picks a bare ``python3``);
* ``spark-submit`` found next to this Python when it is not on ``PATH`` (pip installs it there).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings

DEFAULT_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"
JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs"


class SparkSetupError(AirflowFailException):
    """The Spark side is not set up; the message says what to create or install. Fails the task
    without retries: retrying cannot create a connection or install a jar."""


def job_path(name: str) -> str:
    """The installed provider's spark-submit entry point ``jobs/<name>.py``."""
    return str(JOBS_DIR / f"{name}.py")


def _ensure_spark_submit_on_path() -> None:
    if shutil.which("spark-submit"):
        return
    here = Path(sys.executable).parent
    if (here / "spark-submit").exists():
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"
        return
    raise SparkSetupError(
        "spark-submit is not on PATH: install pyspark into Airflow's Python (pip install pyspark) or add your "
        "Spark distribution's bin/ to PATH on the Airflow workers"
    )


def spark_master(conn_id: str) -> str:
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:
        raise SparkSetupError(
            f"Spark connection {conn_id!r} is not defined: create it (type Spark, host local[*], spark://host:7077, "
            "yarn or k8s://...), e.g. AIRFLOW_CONN_SPARK_DEFAULT='{\"conn_type\": \"spark\", \"host\": \"local[*]\"}' "
            f"({type(exc).__name__})"
        ) from None
    host = conn.host or ""
    if conn.conn_type == "spark" and ("://" in host or not conn.port):
        return host
    return f"{conn.conn_type}://{host}" + (f":{conn.port}" if conn.port else "")


def build_hook(
    *,
    conn_id: str,
    settings: ConnectionSettings,
    name: str,
    application_args: list[str],
    conf: dict[str, Any] | None = None,
    jars: str | None = None,
    driver_memory: str | None = None,
    executor_memory: str | None = None,
    num_executors: int | None = None,
    executor_cores: int | None = None,
    py_files: str | None = None,
    verbose: bool = False,
    extra_env: dict[str, str] | None = None,
) -> Any:
    """A ``SparkSubmitHook`` for one of this provider's jobs (see the module doc)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    _ensure_spark_submit_on_path()
    master = spark_master(conn_id)
    env = {"MYSQLCDC_SOURCE": json.dumps(settings.to_dict()), **(extra_env or {})}
    conf = dict(conf or {})
    conf.setdefault("spark.log.level", "WARN")  # Spark's INFO lines every trigger would bury the job's own log
    # A driver OutOfMemoryError can leave a streaming query hung with no error (seen with 5M-row
    # micro-batches on a 1g driver): exit the JVM instead, so the job fails, its run record says so
    # and an Airflow retry or `status` sees it. Measured: the JVM prints "Terminating due to
    # java.lang.OutOfMemoryError" and spark-submit exits non-zero.
    java_opts = str(conf.get("spark.driver.extraJavaOptions", ""))
    if "OutOfMemoryError" not in java_opts:
        conf["spark.driver.extraJavaOptions"] = f"{java_opts} -XX:+ExitOnOutOfMemoryError".strip()
    if master.startswith("local"):
        for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
            env.setdefault(var, os.environ.get(var, sys.executable))
        conf.setdefault("spark.sql.session.timeZone", "UTC")
    if jars is None:
        jars = DEFAULT_JDBC_JAR
        if not Path(jars).exists() and master.startswith("local"):
            raise SparkSetupError(
                f"the JDBC driver {jars} is missing: apt-get install libmariadb-java (or pass jars= the path of "
                "MariaDB Connector/J, or MySQL Connector/J for Oracle MySQL)"
            )
    return SparkSubmitHook(
        conf=conf,
        conn_id=conn_id,
        jars=jars or None,
        py_files=py_files,
        driver_memory=driver_memory,
        executor_memory=executor_memory,
        num_executors=num_executors,
        executor_cores=executor_cores,
        name=name,
        application_args=application_args,
        env_vars=env,
        verbose=verbose,
    )
