"""The run's conf against the DAG's params: a key that is no param is a typo, refused before any work.

Airflow passes conf keys that are not params through without a word, so ``{"tabels": [...]}`` would
run the pipeline on the default tables. The first task of each example DAG (the plan, the stop)
calls :func:`refuse_unknown_conf_keys`; a DAG without params has no form to compare with and is
left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_mysqlcdc.core.param_values import unknown_keys_problem


def refuse_unknown_conf_keys(task: Any, context: Any) -> None:
    """Fail ``task`` (no retry) when the DAG run's conf has a key that is not a param of its DAG."""
    from airflow.sdk.exceptions import AirflowFailException

    dag_run = context.get("dag_run") if isinstance(context, Mapping) else None
    conf = getattr(dag_run, "conf", None)
    if not isinstance(conf, Mapping) or not conf or not task.has_dag():
        return
    known = list(task.dag.params.keys())
    if not known:
        return
    problem = unknown_keys_problem(conf.keys(), known, f"DAG {task.dag.dag_id}")
    if problem:
        raise AirflowFailException(problem)


__all__ = ["refuse_unknown_conf_keys"]
