"""The snapshot and stream operators' base: the Spark provider's ``SparkSubmitOperator`` running a job
of this provider, built the way ``SparkJDBCOperator`` builds on it.

Every spark-submit option (``conn_id``, ``conf``, ``jars``, ``packages``, memory and cores,
``num_executors``, kerberos ``principal``/``keytab``, ``proxy_user``, ``env_vars``, ``verbose``,
status polling, ``on_kill``) is the parent's; this base adds the arguments every CDC job has and
swaps in :class:`~airflow_provider_mysqlcdc.hooks.spark_submit.MySqlCdcSparkSubmitHook`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_mysqlcdc.hooks.spark_submit import MySqlCdcSparkSubmitHook

JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs"


def job_path(name: str) -> str:
    """The installed provider's spark-submit entry point ``jobs/<name>.py``."""
    return str(JOBS_DIR / f"{name}.py")


class MySqlCdcSparkSubmitOperator(SparkSubmitOperator):
    """A ``SparkSubmitOperator`` for one of this provider's jobs; subclasses set the job and its arguments.

    ``application`` defaults to the provider's own job (pass another path if the cluster needs one,
    e.g. on HDFS/S3); ``application_args`` and, unless given, ``name`` are set by the subclass from
    the CDC arguments.

    :param pipeline_id: the pipeline (its directory in the state store)
    :param state_root: the state store: a local directory, or an fsspec URL shared by all workers
    :param sink_root: where the Delta tables are (``<sink_root>/<db>/<table>``)
    :param plan_id: the plan this task carries out (``MySqlCdcPlanOperator``'s)
    :param mysql_cdc_conn_id: the source connection (type ``mysql_cdc``)
    :param storage_conn_id: the connection holding the object-store credentials of ``sink_root`` and
        ``state_root`` (e.g. ``aws_default``); unset for a local lake or the machine's credentials
    :param spark_conn_id: deprecated name of ``conn_id``
    :param kwargs: every argument of ``SparkSubmitOperator`` (``conn_id`` is the Spark connection)
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "pipeline_id",
        "state_root",
        "sink_root",
        "plan_id",
        "mysql_cdc_conn_id",
        "storage_conn_id",
    )
    template_fields_renderers = {"conf": "json", "env_vars": "json", "application_args": "py"}

    def __init__(
        self,
        *,
        pipeline_id: str,
        state_root: str,
        sink_root: str | None = None,
        plan_id: str | None = None,
        mysql_cdc_conn_id: str = "mysql_cdc_default",
        storage_conn_id: str | None = None,
        spark_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if spark_conn_id is not None:  # the name before the operators became SparkSubmitOperators
            warnings.warn(
                "spark_conn_id is deprecated: pass the Spark connection as conn_id (SparkSubmitOperator's name)",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs.setdefault("conn_id", spark_conn_id)
        kwargs.setdefault("name", "")  # "" = named after the pipeline at run time (the parent's default names nothing)
        super().__init__(**kwargs)
        self.pipeline_id = pipeline_id
        self.state_root = state_root
        self.sink_root = sink_root
        self.plan_id = plan_id
        self.mysql_cdc_conn_id = mysql_cdc_conn_id
        self.storage_conn_id = storage_conn_id or None
        self._lineage_tables: list[str] = []  # what the job read and wrote, for OpenLineage

    def _get_hook(self, detach_log: str | None = None) -> MySqlCdcSparkSubmitHook:
        """The parent's hook arguments, plus the source connection (and a detached log, for the stream)."""
        return MySqlCdcSparkSubmitHook(
            mysql_cdc_conn_id=self.mysql_cdc_conn_id,
            storage_conn_id=self.storage_conn_id,
            detach_log=detach_log,
            conf=self.conf,
            conn_id=self._conn_id,
            files=self.files,
            py_files=self.py_files,
            archives=self._archives,
            driver_class_path=self.driver_class_path,
            jars=self.jars,
            java_class=self._java_class,
            packages=self.packages,
            exclude_packages=self.exclude_packages,
            repositories=self._repositories,
            total_executor_cores=self._total_executor_cores,
            executor_cores=self._executor_cores,
            executor_memory=self._executor_memory,
            driver_memory=self._driver_memory,
            keytab=self.keytab,
            principal=self.principal,
            proxy_user=self.proxy_user,
            name=self.name,
            num_executors=self._num_executors,
            status_poll_interval=self._status_poll_interval,
            application_args=self.application_args,
            env_vars=self.env_vars,
            verbose=self._verbose,
            spark_binary=self._spark_binary,
            properties_file=self.properties_file,
            yarn_queue=self._yarn_queue,
            deploy_mode=self._deploy_mode,
            use_krb5ccache=self._use_krb5ccache,
            post_submit_commands=self.post_submit_commands,
            track_driver_via_k8s_api=self._track_driver_via_k8s_api,
            yarn_track_via_rm_api=self._yarn_track_via_rm_api,
            yarn_rm_auth=self._yarn_rm_auth,
        )

    def state_store(self) -> Any:
        """The pipeline's state store, reached with the storage connection's credentials."""
        from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage
        from airflow_provider_mysqlcdc.state import StateStore

        return StateStore(self.state_root, self.pipeline_id, lake_storage(self.storage_conn_id))

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the source tables the job read, the Delta tables it wrote.

        ``None`` when the OpenLineage provider is not installed, or the job touched no table.
        """
        from airflow_provider_mysqlcdc.operators._lineage import operator_lineage

        if not self._lineage_tables or not self.sink_root:
            return None
        source = self._hook.source if isinstance(self._hook, MySqlCdcSparkSubmitHook) else None
        if source is None:
            from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook

            source = MySqlCdcHook(self.mysql_cdc_conn_id).settings
        return operator_lineage(source.host, source.port, self.sink_root, self._lineage_tables)
