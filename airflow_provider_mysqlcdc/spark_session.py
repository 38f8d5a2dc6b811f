"""One way to build the Spark session every job and test uses, so that no path forgets a setting.

The settings here are the ones the type mapping (:mod:`airflow_provider_mysqlcdc.core.types`)
depends on; a session built another way can silently change values:

* ``spark.sql.session.timeZone=UTC`` — Spark renders and casts TIMESTAMP values in the session
  zone; the lakehouse stores every DATETIME/TIMESTAMP as a UTC instant (docs/architecture.md, "Types and time zones").
* ``spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS`` — staged Parquet files are adopted
  by the Delta sink as they are; INT96 (Spark's legacy default) is not a Delta timestamp and
  TIMESTAMP_MILLIS would drop DATETIME(6) microseconds.
* ``spark.sql.parquet.datetimeRebaseModeInWrite=CORRECTED`` — write dates/timestamps in the
  proleptic Gregorian calendar that pyarrow, delta-rs and the binlog path use. ``EXCEPTION``
  (the historic default) fails on DATE '1000-01-01'; ``LEGACY`` would shift such dates.
* ``spark.jars`` — the MariaDB Connector/J jar Debian ships (``libmariadb-java``).
* ``-Duser.timezone=UTC`` for the driver and executor JVMs — Spark rebases ``java.sql.Timestamp``
  values a JDBC driver builds for instants before 1900 in the JVM's default zone (on a New York JVM
  DATETIME '1800-01-01' came out 4:56:02 early). The snapshot's own JDBC read no longer builds such
  values (``core.projection.jdbc_read`` sends dates and times as integers), so this guards plain JDBC
  reads of the same session. The option only acts when this call starts the JVM (local mode, or
  the app's first session); under spark-submit pass it with ``--conf``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"

#: The settings the canonical type mapping relies on (see the module docstring).
REQUIRED_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
}


#: Spark loggers set to a level above their routine messages. ``ProcessingTimeExecutor`` warns
#: "Current batch is falling behind" after every micro-batch longer than the trigger interval: the
#: normal state of a stream catching up, which each batch's own log line shows (its seconds and lag).
QUIET_SPARK_LOGGERS: dict[str, str] = {
    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor": "ERROR",
    "org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor": "ERROR",  # its name before Spark 4.1
}


def build_spark_session(
    app_name: str,
    master: str | None = "local[2]",
    jdbc_jar: str | None = None,
    extra_conf: dict[str, str] | None = None,
) -> Any:
    """Get or create a SparkSession configured for the CDC paths.

    ``master=None`` leaves the master to ``spark-submit`` (the jobs under ``spark_jobs/``); a
    string sets it (tests, the embedded ``local[*]`` default). ``jdbc_jar`` defaults to Debian's
    Connector/J when that file exists; on a cluster pass ``--jars`` to spark-submit instead (a
    running context ignores ``spark.jars``). ``extra_conf`` is applied last and wins, except
    that it cannot weaken :data:`REQUIRED_CONF` — a ``ValueError`` names the conflicting key,
    because a different time zone or timestamp type breaks snapshot/binlog value equality.

    pyspark is imported here, not at module import, so Airflow workers that only plan or poll
    can import this package without a JVM.
    """
    from pyspark.sql import SparkSession

    extra = dict(extra_conf or {})
    for key, value in extra.items():
        if key in REQUIRED_CONF and value != REQUIRED_CONF[key]:
            raise ValueError(
                f"{key}={value!r} conflicts with the CDC type mapping, which needs {REQUIRED_CONF[key]!r}: "
                "drop it from extra_conf"
            )
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    jar = jdbc_jar if jdbc_jar is not None else (DEFAULT_JDBC_JAR if os.path.exists(DEFAULT_JDBC_JAR) else None)
    if jar:
        builder = builder.config("spark.jars", jar)
    conf: dict[str, str] = dict(REQUIRED_CONF)
    if master and master.startswith("local"):
        # One machine: no UI port to collide on between concurrent jobs/tests, and few shuffle
        # partitions (the default 200 makes small jobs slow).
        conf.setdefault("spark.ui.enabled", "false")
        conf.setdefault("spark.sql.shuffle.partitions", "4")
        # Python workers must be this interpreter (it has the package, pyarrow, mysql-replication),
        # not whatever `python3` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        opts = extra.pop(key, "")
        if "-Duser.timezone=" not in opts:
            opts = f"{opts} -Duser.timezone=UTC".strip()
        conf[key] = opts
    conf.update(extra)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # getOrCreate() on an existing session (spark-submit, a notebook) keeps its runtime settings;
    # re-apply the ones values depend on.
    for key, value in REQUIRED_CONF.items():
        spark.conf.set(key, value)
    _warn_if_jvm_zone_is_not_utc(spark)
    quiet_spark_loggers(spark)
    return spark


def quiet_spark_loggers(spark: Any, levels: dict[str, str] | None = None) -> None:
    """Set the log4j level of each of :data:`QUIET_SPARK_LOGGERS` (or ``levels``) in the driver JVM.

    At run time, not by a log4j2 file: a cluster's own log4j configuration stays as it is, and only
    these loggers change."""
    try:
        jvm = spark._jvm
        for name, level in (levels or QUIET_SPARK_LOGGERS).items():
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                name, jvm.org.apache.logging.log4j.Level.toLevel(level)
            )
    except Exception as exc:  # Spark Connect, or a JVM without log4j-core: leave its logging alone
        log.debug("could not set Spark's log levels: %s", exc)


def _warn_if_jvm_zone_is_not_utc(spark: Any) -> None:
    """A session that existed before this call may run a non-UTC JVM: DATETIME values before 1900
    read by plain JDBC reads (not the snapshot's) would then shift. Warn rather than fail."""
    try:
        zone = str(spark._jvm.java.util.TimeZone.getDefault().getID())
    except Exception:  # Spark Connect or another non-classic session: nothing to inspect
        return
    if zone not in ("UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z"):
        log.warning(
            "the Spark driver JVM runs in time zone %s: DATETIME values before 1900 can shift in plain JDBC "
            "reads of this session. Start Spark with --conf spark.driver.extraJavaOptions=-Duser.timezone=UTC and "
            "--conf spark.executor.extraJavaOptions=-Duser.timezone=UTC",
            zone,
        )
