"""``MySqlCdcSparkSubmitHook``: the Spark provider's ``SparkSubmitHook`` set up for this provider's jobs.

Like the Spark provider's ``SparkJDBCHook``, it subclasses ``SparkSubmitHook`` and adds only what
its own jobs need; every spark-submit option (master and deploy mode from the ``spark`` connection,
conf, jars, packages, memory and cores, kerberos, proxy user, env_vars, status polling, ``on_kill``)
stays the parent's. The ``spark`` connection decides where jobs run (``local[*]``, ``spark://``,
YARN, Kubernetes), so a DAG moves from a laptop to a cluster by changing a connection, not code.
What it adds:

* the source connection as JSON in ``MYSQLCDC_SOURCE`` and the lake's object-store credentials
  in ``MYSQLCDC_STORAGE``: environment variables, never arguments (arguments show in ``ps``, in
  Airflow's log of the command line and on the Spark UI's environment page);
* the MariaDB/MySQL JDBC driver jar (``jars``; Debian's ``libmariadb-java`` by default);
* for local masters, the driver's and workers' Python = the Python running Airflow, which has this
  provider, pyarrow and deltalake installed (otherwise Spark picks a bare ``python3``);
* ``spark-submit`` found next to this Python when it is not on ``PATH`` (pip installs it there);
* a detached submit for the long-lived stream (see :meth:`MySqlCdcSparkSubmitHook.submit`);
* spark-submit's output in the task log at each line's own level (the parent logs every line at
  INFO, so a Spark ERROR reads like any other line): :class:`SparkLogLevels`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.storage import STORAGE_ENV, LakeStorage
from airflow_provider_mysqlcdc.stream.launcher import start_detached

DEFAULT_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"
SOURCE_ENV = "MYSQLCDC_SOURCE"


class SparkSetupError(AirflowFailException):
    """The Spark side is not set up; the message says what to create or install. Fails the task
    without retries: retrying cannot create a connection or install a jar."""


def spark_master(conn_id: str) -> str:
    """The master URL of the ``spark`` connection, read before the hook exists: local masters get
    other defaults. Unlike the parent hook, which falls back to ``yarn``, a missing connection fails
    with the fix, since a CDC job sent to a YARN that is not there only times out."""
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


def ensure_spark_submit_on_path() -> None:
    """pip installs ``spark-submit`` next to the Python, which a service's ``PATH`` often lacks."""
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


def job_conf(conf: dict[str, Any] | None, master: str) -> dict[str, Any]:
    """The user's Spark conf plus this provider's defaults (the user's values win)."""
    out = dict(conf or {})
    out.setdefault("spark.log.level", "WARN")  # Spark's INFO lines every trigger would bury the job's own log
    # A driver OutOfMemoryError can leave a streaming query hung with no error: exit the JVM
    # instead, so the job fails, its run record says so and a retry or `status` sees it.
    java_opts = str(out.get("spark.driver.extraJavaOptions", ""))
    if "OutOfMemoryError" not in java_opts:
        out["spark.driver.extraJavaOptions"] = f"{java_opts} -XX:+ExitOnOutOfMemoryError".strip()
    if master.startswith("local"):
        out.setdefault("spark.sql.session.timeZone", "UTC")
    return out


def secret_env(source: ConnectionSettings, storage: LakeStorage | None = None) -> dict[str, str]:
    """The job's secrets as environment variables: the source connection, the lake's credentials."""
    env = {SOURCE_ENV: json.dumps(source.to_dict())}
    if storage is not None and storage.options:
        env[STORAGE_ENV] = storage.to_json()
    return env


def job_env(
    source: ConnectionSettings, env_vars: dict[str, Any] | None, master: str, storage: LakeStorage | None = None
) -> dict[str, Any]:
    """The job's environment: the source connection, the lake's storage credentials, the user's
    env_vars, local Python defaults."""
    env: dict[str, Any] = {**secret_env(source, storage), **(env_vars or {})}
    if master.startswith("local"):
        for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
            env.setdefault(var, os.environ.get(var, sys.executable))
    return env


def job_jars(jars: str | None, master: str) -> str | None:
    """``None`` means the default JDBC driver; ``""`` means none (it is on the cluster's classpath)."""
    if jars is None:
        if not Path(DEFAULT_JDBC_JAR).exists() and master.startswith("local"):
            raise SparkSetupError(
                f"the JDBC driver {DEFAULT_JDBC_JAR} is missing: apt-get install libmariadb-java (or pass jars= the "
                "path of MariaDB Connector/J, or MySQL Connector/J for Oracle MySQL)"
            )
        return DEFAULT_JDBC_JAR
    return jars or None


_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "SEVERE": logging.ERROR, "FATAL": logging.CRITICAL,
           "CRITICAL": logging.CRITICAL}  # fmt: skip
_LEVEL_WORDS = "|".join(_LEVELS)
#: A line with a level of its own: log4j's default layout (``26/11/27 21:29:15 WARN Utils: ...``) or
#: Python logging's (``2026-11-27 21:29:19,787 ERROR name: ...``), Spark's JSON layout, a bare
#: ``WARNING: ...`` (the JVM's, java.util.logging's second line), a job's ``error: ...``.
_OWN_LEVEL = (
    re.compile(r"^\d{2,4}[-/]\d{2}[-/]\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+(?:\[[^\]]*\]\s+)?"
               rf"({_LEVEL_WORDS})\b"),
    re.compile(r'^\{.*?"level"\s*:\s*"(\w+)"'),
    re.compile(rf"^({_LEVEL_WORDS}):\s", re.IGNORECASE),
)
#: A line that belongs to the one before: a stack frame, a cause, a Python traceback, an exception.
_CONTINUATION = re.compile(
    r"^(at |Caused by|Suppressed|\.\.\. \d+ more|Traceback|File \"|[\w.$]+(Error|Exception|Throwable)\b)"
)
_METHODS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error",
            logging.CRITICAL: "critical"}  # fmt: skip


class SparkLogLevels:
    """The level of each line of spark-submit's output, line after line: the level the line itself
    names; a stack-trace line takes the level of the line it belongs to; anything else is INFO."""

    def __init__(self) -> None:
        self.previous = logging.INFO

    def of(self, line: str) -> int:
        text = line.strip()
        for pattern in _OWN_LEVEL:
            m = pattern.match(text)
            if m and m.group(1).upper() in _LEVELS:
                self.previous = _LEVELS[m.group(1).upper()]
                return self.previous
        return self.previous if _CONTINUATION.match(text) else logging.INFO


class _LevelledLines:
    """The hook's logger while the parent logs spark-submit's output: a plain line logged at INFO goes
    out at its own level (:class:`SparkLogLevels`); every other call is the logger's own."""

    def __init__(self, logger: Any, levels: SparkLogLevels) -> None:
        self._logger = logger
        self._levels = levels

    def info(self, msg: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(msg, str):
            return self._logger.info(msg, *args, **kwargs)
        return getattr(self._logger, _METHODS[self._levels.of(msg)])(msg)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


class MySqlCdcSparkSubmitHook(SparkSubmitHook):
    """``SparkSubmitHook`` for a job of this provider (see the module doc).

    :param mysql_cdc_conn_id: the source connection (type ``mysql_cdc``); the job receives it in
        the environment, never on the command line
    :param storage_conn_id: the connection with the lake's object-store credentials
        (``hooks/object_storage.py``; ``None``: a local lake or the machine's credentials); the job
        receives them in the environment too
    :param detach_log: submit detached, with spark-submit's output going to this file (see
        :meth:`submit`); ``None`` (default) submits like the parent, waiting for the job
    :param kwargs: every other argument of ``SparkSubmitHook``; ``conf``, ``env_vars`` and ``jars``
        get this provider's defaults added
    """

    def __init__(
        self,
        *,
        mysql_cdc_conn_id: str = "mysql_cdc_default",
        storage_conn_id: str | None = None,
        detach_log: str | None = None,
        conn_id: str = "spark_default",
        conf: dict[str, Any] | None = None,
        jars: str | None = None,
        env_vars: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook
        from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage

        self.master = spark_master(conn_id)
        ensure_spark_submit_on_path()
        self.mysql_cdc_conn_id = mysql_cdc_conn_id
        self.source = MySqlCdcHook(mysql_cdc_conn_id).settings
        self.storage_conn_id = storage_conn_id
        self.storage = lake_storage(storage_conn_id)
        self.detach_log = detach_log
        super().__init__(
            conf=job_conf(conf, self.master),
            conn_id=conn_id,
            jars=job_jars(jars, self.master),
            env_vars=job_env(self.source, env_vars, self.master, self.storage),
            **kwargs,
        )
        self._secret_env: dict[str, str] = {}
        self._keep_secrets_out_of_confs()
        if detach_log is not None and self.cluster_deploy_mode:
            # the driver runs on the cluster: spark-submit only submits it and returns
            key = "spark.kubernetes.submission.waitAppCompletion" if self._is_kubernetes else (
                "spark.yarn.submit.waitAppCompletion")  # fmt: skip
            self._conf = {**(self._conf or {}), key: (self._conf or {}).get(key, "false")}

    @property
    def cluster_deploy_mode(self) -> bool:
        """The driver runs on the cluster (YARN/Kubernetes cluster mode), not in spark-submit."""
        return self._connection["deploy_mode"] == "cluster"

    def _keep_secrets_out_of_confs(self) -> None:
        """On YARN and Kubernetes the parent hook turns ``env_vars`` into ``--conf
        spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``: the secrets would be in the
        command line and on the Spark UI. So they are held back here and given to the spark-submit
        process's own environment instead, which is the driver's in client mode; in cluster mode the
        cluster must deliver them (Kubernetes secrets), or the submit is refused with the fix."""
        if not (self._is_yarn or self._is_kubernetes):
            return
        secrets = {k: self._env_vars.pop(k) for k in (SOURCE_ENV, STORAGE_ENV) if k in (self._env_vars or {})}
        if self._connection["deploy_mode"] != "cluster":
            self._secret_env = secrets
            return
        conf = self._conf or {}
        missing = [k for k in secrets if f"spark.kubernetes.driver.secretKeyRef.{k}" not in conf]
        if self._is_kubernetes and not missing:
            return  # Kubernetes puts the secrets into the driver pod's environment
        raise SparkSetupError(
            "cluster deploy mode would put the source password and storage keys into Spark confs (the command "
            "line and the Spark UI): "
            + (
                "store them in a Kubernetes secret (`mysqlcdc job-secrets` prints the values) and set conf "
                + ", ".join(f"spark.kubernetes.driver.secretKeyRef.{k}=<secret>:{k}" for k in missing)
                + " (README \"Deploy to production\"), or use client deploy mode"
                if self._is_kubernetes
                else "use client deploy mode on YARN (the driver runs on the Airflow worker), or Kubernetes secrets"
            )
        )

    def _build_spark_submit_command(self, application: str) -> list[str]:
        cmd = super()._build_spark_submit_command(application)
        if self._secret_env:  # the driver is this process's child: its environment, not a conf
            self._env = {**(self._env or {}), **self._secret_env}
        return cmd

    def spark_submit_command(self, application: str) -> list[str]:
        """The spark-submit command line :meth:`submit` runs, built by the parent hook."""
        return self._build_spark_submit_command(application)

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        """Submit like the parent, or, with ``detach_log``, start spark-submit and return at once.

        The parent's ``submit`` reads spark-submit's output until it exits. A detached stream must
        outlive the task that starts it, and in ``local[*]`` or client mode spark-submit *is* the
        driver; so it is started in its own session (no controlling task, stdin closed) with its
        output in ``detach_log``. The process is :attr:`process`; the parent's ``on_kill`` still
        kills it while the task runs.
        """
        if self.detach_log is None:
            return super().submit(application, **kwargs)
        cmd = self.spark_submit_command(application)
        env = {**os.environ, **{k: str(v) for k, v in (self._env or {}).items()}}  # as the parent's submit
        self._submit_sp = start_detached(cmd, env, self.detach_log, **kwargs)
        return None

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        """The parent's, with each line of spark-submit's output logged at its own level, not INFO."""
        logger = self.log
        self._log = _LevelledLines(logger, SparkLogLevels())
        try:
            super()._process_spark_submit_log(itr)
        finally:
            self._log = logger

    @property
    def process(self) -> subprocess.Popen | None:
        """The spark-submit process of the last :meth:`submit`, once started."""
        return self._submit_sp
