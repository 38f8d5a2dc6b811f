"""Operators: plan a run, snapshot chunk groups (mapped), launch and stop the binlog stream, verify."""

from airflow_provider_mysqlcdc.operators.plan import MySqlCdcPlanOperator
from airflow_provider_mysqlcdc.operators.snapshot import MySqlCdcSnapshotOperator
from airflow_provider_mysqlcdc.operators.stream import MySqlCdcStopStreamOperator, MySqlCdcStreamOperator
from airflow_provider_mysqlcdc.operators.verify import MySqlCdcVerifyOperator

__all__ = [
    "MySqlCdcPlanOperator",
    "MySqlCdcSnapshotOperator",
    "MySqlCdcStopStreamOperator",
    "MySqlCdcStreamOperator",
    "MySqlCdcVerifyOperator",
]
