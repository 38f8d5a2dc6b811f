"""``MySqlCdcStreamSensor``: wait until a pipeline's stream has caught up (deferrable by default)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator


class MySqlCdcStreamSensor(BaseSensorOperator):
    """Succeeds when the stream is alive and has applied everything up to the source's binlog
    position at the moment the sensor started (``condition="caught_up"``), or as soon as it is
    alive with a lag of at most ``max_lag_seconds`` (``condition="lag"``). Fails at once, with
    the driver's error, if the stream is not running.

    ``deferrable=True`` (the default) hands the wait to the triggerer
    (:class:`~airflow_provider_mysqlcdc.triggers.stream.MySqlCdcStreamTrigger`), so a long catch-up
    holds no worker slot. ``stream_handle`` (the stream operator's XCom) makes the sensor skip
    when that run started no stream (``startup_mode=snapshot-only``).
    """

    template_fields: Sequence[str] = (
        "pipeline_id", "state_root", "stream_handle", "condition", "mysql_cdc_conn_id", "storage_conn_id",
    )  # fmt: skip

    def __init__(
        self,
        *,
        pipeline_id: str,
        state_root: str,
        condition: str = "caught_up",
        max_lag_seconds: float | None = None,
        stream_handle: Any = None,
        mysql_cdc_conn_id: str = "mysql_cdc_default",
        storage_conn_id: str | None = None,
        deferrable: bool = True,
        poke_interval: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.pipeline_id = pipeline_id
        self.state_root = state_root
        self.condition = condition
        self.max_lag_seconds = max_lag_seconds
        self.stream_handle = stream_handle
        self.mysql_cdc_conn_id = mysql_cdc_conn_id
        self.storage_conn_id = storage_conn_id or None
        self.deferrable = deferrable
        self._target: dict[str, Any] | None = None

    def _prepare(self) -> None:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from airflow_provider_mysqlcdc.hooks.mysql_cdc import MySqlCdcHook

        h = self.stream_handle
        if isinstance(h, dict) and not h.get("launched") and not h.get("running"):
            raise AirflowSkipException("this run started no stream (snapshot-only): nothing to watch")
        if self.condition not in ("caught_up", "lag"):
            raise AirflowFailException(f"condition {self.condition!r} is not 'caught_up' or 'lag'")
        if self.condition == "lag" and self.max_lag_seconds is None:
            raise AirflowFailException("condition 'lag' needs max_lag_seconds")
        if self.condition == "caught_up":
            off = MySqlCdcHook(self.mysql_cdc_conn_id).current_offset()
            self._target = {"file": off.file, "pos": off.pos}
            self.log.info("waiting for stream %s to reach the source's offset %s", self.pipeline_id, off)

    def execute(self, context: Any) -> Any:
        self._prepare()
        if not self.deferrable:
            super().execute(context)
            return self._state()
        from airflow_provider_mysqlcdc.triggers.stream import MySqlCdcStreamTrigger

        self.defer(
            trigger=MySqlCdcStreamTrigger(
                state_root=self.state_root,
                pipeline_id=self.pipeline_id,
                target_offset=self._target,
                max_lag_seconds=self.max_lag_seconds,
                poll_interval=float(self.poke_interval),
                storage_conn_id=self.storage_conn_id,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)),
        )

    def _state(self) -> dict[str, Any]:
        from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage
        from airflow_provider_mysqlcdc.state import StateStore
        from airflow_provider_mysqlcdc.stream.control import stream_state

        return stream_state(StateStore(self.state_root, self.pipeline_id, lake_storage(self.storage_conn_id)))

    def poke(self, context: Any) -> bool:
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_provider_mysqlcdc.core.offset import BinlogOffset
        from airflow_provider_mysqlcdc.stream.control import watch_condition

        target = BinlogOffset.from_dict(self._target) if self._target else None
        done, error = watch_condition(self._state(), target, self.max_lag_seconds)
        if error:  # the stream is not running: a retry of the watch cannot help
            raise AirflowFailException(error)
        return done

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        if event.get("status") != "success":  # the stream is not running: a retry of the watch cannot help
            raise AirflowFailException(event.get("message", "the stream watch failed"))
        st = event["state"]
        if self.condition == "caught_up":
            target = event.get("target") or self._target
            where = f"{target['file']}:{target['pos']}" if target else "?"
            self.log.info("stream %s caught up: committed %s, at or past the source's offset %s at the start",
                          self.pipeline_id, st.get("committed_offset"), where)  # fmt: skip
        else:
            self.log.info("stream %s within %ss: lag %ss", self.pipeline_id, self.max_lag_seconds,
                          st.get("lag_seconds"))  # fmt: skip
        return st
