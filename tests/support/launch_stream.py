"""Launch a pipeline's stream detached from a process of its own, as the example DAG's ``stream`` task does.

``python -m tests.support.launch_stream '<json>'`` builds ``MySqlCdcStreamOperator`` (detached
mode) and runs its ``execute``: the plan id falls back to the state store's current plan pointer,
the stream restarts from its checkpoint. Connections come from the environment (``AIRFLOW_CONN_*``),
as in an Airflow worker. The end-to-end test kills this process (and its process group) as soon as
the stream's spark-submit has started, to prove a detached stream outlives its launcher.

The JSON object: ``pipeline_id``, ``state_root``, ``storage_conn_id``, ``conf`` (Spark conf).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    from airflow_provider_mysqlcdc.operators import MySqlCdcStreamOperator

    op = MySqlCdcStreamOperator(
        task_id="stream",
        pipeline_id=cfg["pipeline_id"],
        state_root=cfg["state_root"],
        storage_conn_id=cfg.get("storage_conn_id"),
        conf=cfg.get("conf") or {},
        stream_mode="detached",
    )
    result = op.execute({})
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
