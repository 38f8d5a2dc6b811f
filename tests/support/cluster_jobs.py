"""PySpark applications the infrastructure tests ``spark-submit`` to the standalone test cluster.

Run as ``spark-submit --master spark://… cluster_jobs.py <job> <result.json>``; the job's settings
(including the S3 secret) come in the environment variable ``CLUSTER_JOB_CONFIG`` (JSON), never on
the command line, where every user of the machine could read them. The result is written as JSON
to the path given.

Executors have no S3 connector in the JVM (pyspark ships no hadoop-aws), so all object-store I/O
is done from Python, through s3fs and pyarrow, inside the tasks. This file imports nothing from
``tests``: spark-submit runs it as ``__main__`` from its own path.

* ``write``: each task imports the provider and pyarrow, writes its rows as one Parquet file to
  the S3 server; the driver reads the directory back.
* ``slow``: each task's first attempt leaves a marker file and waits until the test creates
  ``<marker_dir>/release`` (at most ``hold_seconds``), so a test can kill an executor JVM while
  every task is running; the result says which attempt produced each partition.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _fs(s3: dict[str, str]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        key=s3["access_key_id"],
        secret=s3["secret_access_key"],
        endpoint_url=s3["endpoint_url"],
        client_kwargs={"region_name": s3["region"]},
        skip_instance_cache=True,
    )


def write_job(sc: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    s3, prefix, rows = cfg["s3"], cfg["prefix"], int(cfg["rows_per_partition"])
    parts = int(cfg["partitions"])

    def write_partition(index: int, _it: Any) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        import airflow_provider_mysqlcdc

        ids = list(range(index * rows, (index + 1) * rows))
        table = pa.table({"id": pa.array(ids, pa.int64()), "part": pa.array([index] * rows, pa.int32())})
        path = f"{s3['bucket']}/{prefix}/part-{index:05d}.parquet"
        pq.write_table(table, path, filesystem=_fs(s3))
        yield {
            "partition": index,
            "path": path,
            "rows": rows,
            "python": sys.executable,
            "provider": airflow_provider_mysqlcdc.__file__,
            "pid": os.getpid(),
        }

    written = sc.parallelize(range(parts), parts).mapPartitionsWithIndex(write_partition).collect()

    import pyarrow.parquet as pq

    back = pq.read_table(f"{s3['bucket']}/{prefix}", filesystem=_fs(s3))
    return {
        "written": written,
        "read_rows": back.num_rows,
        "read_id_sum": sum(back.column("id").to_pylist()),
        "read_parts": sorted(set(back.column("part").to_pylist())),
    }


def slow_job(sc: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    marker_dir, hold_s, parts, n = cfg["marker_dir"], float(cfg["hold_seconds"]), int(cfg["partitions"]), cfg["n"]

    def run(index: int, it: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx else -1
        values = list(it)
        if attempt == 0:
            with open(os.path.join(marker_dir, f"p{index}-pid{os.getpid()}"), "w") as f:
                f.write(str(time.time()))
            # hold until the test releases us (after killing an executor), at most hold_s
            deadline = time.monotonic() + hold_s
            while not os.path.exists(os.path.join(marker_dir, "release")) and time.monotonic() < deadline:
                time.sleep(0.1)
        yield {"partition": index, "attempt": attempt, "count": len(values), "sum": sum(values)}

    results = sc.parallelize(range(n), parts).mapPartitionsWithIndex(run).collect()
    return {"results": results}


JOBS = {"write": write_job, "slow": slow_job}


def main() -> None:
    job, result_path = sys.argv[1], sys.argv[2]
    cfg = json.loads(os.environ["CLUSTER_JOB_CONFIG"])
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"infra-{job}").getOrCreate()
    try:
        out = JOBS[job](spark.sparkContext, cfg)
        out["app_id"] = spark.sparkContext.applicationId
    finally:
        spark.stop()
    with open(result_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
