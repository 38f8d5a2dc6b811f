"""The deferrable trigger and the sensor that watch a stream through its run record.

The run record is written by the same ``StreamRunRecorder`` the stream's driver uses; no Spark is
needed to show that the trigger serialises, fires on success and on a dead stream, and that the
sensor's poke (non-deferrable mode) and its completion callback agree with it.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest

from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import RUN, STATUS, StreamRunRecorder
from airflow_provider_mysqlcdc.triggers.stream import MySqlCdcStreamTrigger


def _first_event(trigger: MySqlCdcStreamTrigger, timeout: float = 10.0) -> dict:
    async def first() -> dict:
        async for ev in trigger.run():
            return ev.payload
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout))


def test_trigger_serialises_to_an_importable_class(tmp_path: Path) -> None:
    t = MySqlCdcStreamTrigger(str(tmp_path), "p", {"file": "b.000001", "pos": 4}, 5.0, 0.1)
    path, kwargs = t.serialize()
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (path, kwargs)


def test_trigger_fires_when_the_stream_reaches_the_target(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    rec = StreamRunRecorder(store, "r1")
    rec.write(state="running", committed_offset={"file": "b.000001", "pos": 100})
    trigger = MySqlCdcStreamTrigger(str(tmp_path), "p", {"file": "b.000001", "pos": 500}, None, 0.05)

    async def advance_later() -> dict:
        async def bump() -> None:
            await asyncio.sleep(0.3)
            rec.write(state="running", committed_offset={"file": "b.000002", "pos": 4})

        task = asyncio.create_task(bump())
        async for ev in trigger.run():
            await task
            return ev.payload
        raise AssertionError("no event")

    payload = asyncio.run(asyncio.wait_for(advance_later(), 10))
    assert payload["status"] == "success"
    # fired only once the offset passed the target: the state it reports is the advanced one
    assert payload["state"]["committed_offset"] == {"file": "b.000002", "pos": 4}


def test_trigger_reports_a_dead_stream_with_its_error(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path), "p")
    StreamRunRecorder(store, "r1").write(state="failed", error="binlog file b.000001 has been purged")
    payload = _first_event(MySqlCdcStreamTrigger(str(tmp_path), "p", None, 10.0, 0.05))
    assert payload["status"] == "error" and "purged" in payload["message"]


def test_sensor_poke_and_completion(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowSkipException

    from airflow_provider_mysqlcdc.sensors.stream import MySqlCdcStreamSensor

    store = StateStore(str(tmp_path), "p")
    StreamRunRecorder(store, "r1").write(state="running")
    store.write_json(STATUS, {"lag_seconds": 30.0})
    sensor = MySqlCdcStreamSensor(
        task_id="watch", pipeline_id="p", state_root=str(tmp_path), condition="lag", max_lag_seconds=5,
        deferrable=False,
    )
    sensor._prepare()
    assert sensor.poke({}) is False
    store.write_json(STATUS, {"lag_seconds": 1.5})
    assert sensor.poke({}) is True
    run = store.read_json(RUN)
    store.write_json(RUN, {**run, "state": "failed", "error": "boom"})
    with pytest.raises(AirflowException, match="boom"):
        sensor.poke({})

    assert sensor.execute_complete({}, {"status": "success", "state": {"committed_offset": None}})
    with pytest.raises(AirflowException, match="stream is gone"):
        sensor.execute_complete({}, {"status": "error", "message": "stream is gone"})

    skipping = MySqlCdcStreamSensor(
        task_id="watch", pipeline_id="p", state_root=str(tmp_path), stream_handle={"launched": False},
    )
    with pytest.raises(AirflowSkipException):
        skipping._prepare()
