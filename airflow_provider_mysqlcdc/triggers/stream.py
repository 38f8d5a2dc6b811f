"""``MySqlCdcStreamTrigger``: watch a running stream from the triggerer, holding no worker slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class MySqlCdcStreamTrigger(BaseTrigger):
    """Poll the pipeline's run record in the state store until the stream reaches ``target_offset``
    (and, when given, its lag is at most ``max_lag_seconds``); fire an error event as soon as the
    stream is found not running. The state store is read in a thread: fsspec calls block."""

    def __init__(
        self,
        state_root: str,
        pipeline_id: str,
        target_offset: dict[str, Any] | None = None,
        max_lag_seconds: float | None = None,
        poll_interval: float = 5.0,
        storage_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        self.storage_conn_id = storage_conn_id  # a connection id, never the keys: triggers are serialized
        self.state_root = state_root
        self.pipeline_id = pipeline_id
        self.target_offset = target_offset
        self.max_lag_seconds = max_lag_seconds
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "state_root": self.state_root,
                "pipeline_id": self.pipeline_id,
                "target_offset": self.target_offset,
                "max_lag_seconds": self.max_lag_seconds,
                "poll_interval": self.poll_interval,
                "storage_conn_id": self.storage_conn_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_mysqlcdc.core.offset import BinlogOffset
        from airflow_provider_mysqlcdc.hooks.object_storage import lake_storage
        from airflow_provider_mysqlcdc.state import StateStore
        from airflow_provider_mysqlcdc.stream.control import stream_state, watch_condition

        storage = await asyncio.to_thread(lake_storage, self.storage_conn_id)
        store = StateStore(self.state_root, self.pipeline_id, storage)
        target = BinlogOffset.from_dict(self.target_offset) if self.target_offset else None
        while True:
            state = await asyncio.to_thread(stream_state, store)
            done, error = watch_condition(state, target, self.max_lag_seconds)
            if error:
                yield TriggerEvent({"status": "error", "message": error, "state": state})
                return
            if done:
                yield TriggerEvent({"status": "success", "state": state, "target": self.target_offset})
                return
            self.log.info(
                "stream %s: committed %s, target %s, lag %ss",
                self.pipeline_id, state.get("committed_offset"), self.target_offset, state.get("lag_seconds"),
            )
            await asyncio.sleep(self.poll_interval)
