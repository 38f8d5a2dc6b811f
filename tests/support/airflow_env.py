"""Run the example DAG in Airflow's test mode (``dag.test()``), for the tests and the demo.

Airflow reads its configuration when first imported, so callers set ``AIRFLOW_HOME`` (a private
directory), ``AIRFLOW__CORE__DAGS_FOLDER`` and ``AIRFLOW__CORE__LOAD_EXAMPLES=False`` in the
environment *before* importing anything from Airflow; :func:`airflow_environment` returns them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DAGS_FOLDER = REPO / "dags"


def airflow_environment(home: Path, dags_folder: Path = DAGS_FOLDER) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


def migrate_db() -> None:
    """Create the metadata DB (SQLite under AIRFLOW_HOME) that ``dag.test()`` records runs in."""
    proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"airflow db migrate failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def load_dag(dag_id: str, dags_folder: Path = DAGS_FOLDER) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags_folder))
    if bag.import_errors:
        raise RuntimeError(f"DAG import errors: {bag.import_errors}")
    dag = bag.get_dag(dag_id)
    if dag is None:
        raise KeyError(f"no DAG {dag_id!r} in {dags_folder}")
    return dag


@dataclass
class DagTestRun:
    run_id: str
    state: str
    seconds: float
    task_states: dict[tuple[str, int], str] = field(default_factory=dict)
    xcoms: dict[tuple[str, int, str], Any] = field(default_factory=dict)
    labels: dict[tuple[str, int], str | None] = field(default_factory=dict)  # rendered map index (the UI's label)
    rendered: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # Rendered Templates

    def states_of(self, task_id: str) -> list[str]:
        return [s for (t, _), s in sorted(self.task_states.items()) if t == task_id]

    def xcom(self, task_id: str, map_index: int = -1, key: str = "return_value") -> Any:
        return self.xcoms.get((task_id, map_index, key))

    def mapped_xcoms(self, task_id: str, key: str = "return_value") -> list[Any]:
        return [v for (t, m, k), v in sorted(self.xcoms.items()) if t == task_id and k == key and m >= 0]


def run_dag(dag: Any, conf: dict[str, Any]) -> DagTestRun:
    """``dag.test(run_conf=conf)``, then read back every task's state and XCom from the metadata DB.

    The DAG is parsed afresh for every run: ``dag.test()`` writes the run's conf into the DAG
    object's params, so a second run of the same object would inherit the first run's values
    (e.g. its ``resnapshot_tables``) for every param its conf does not set.
    """
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = load_dag(dag.dag_id, Path(dag.fileloc).parent)
    t0 = time.monotonic()
    dr = dag.test(run_conf=conf)
    out = DagTestRun(dr.run_id, str(getattr(dr.state, "value", dr.state)), time.monotonic() - t0)
    with create_session() as s:
        for ti in s.query(TaskInstance).filter(TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id):
            out.task_states[(ti.task_id, ti.map_index)] = str(getattr(ti.state, "value", ti.state))
            out.labels[(ti.task_id, ti.map_index)] = ti.rendered_map_index
        rtifs = s.query(RenderedTaskInstanceFields).filter(RenderedTaskInstanceFields.dag_id == dag.dag_id,
                                                           RenderedTaskInstanceFields.run_id == dr.run_id)  # fmt: skip
        for r in rtifs:
            out.rendered[(r.task_id, r.map_index)] = dict(r.rendered_fields or {})
        for x in s.query(XComModel).filter(XComModel.dag_id == dag.dag_id, XComModel.run_id == dr.run_id):
            value = x.value
            if isinstance(value, str | bytes):
                try:
                    value = json.loads(value)
                except (ValueError, TypeError):
                    pass
            out.xcoms[(x.task_id, x.map_index, x.key)] = value
    return out
