"""The small tables' carried state (sinks/delta_table_state.py): rows kept within a budget,
least recently used dropped first, the rest of a state kept."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_mysqlcdc.sinks.delta_table_state import TableState, TableStates


def _state(uri: str, rows: int) -> TableState:
    table = pa.table({"id": pa.array(range(rows), pa.int64())})
    return TableState(uri=uri, version=1, schema=table.schema, configuration={}, files={f"{uri}.parquet": 10},
                      log_blocker=None, transactions={"app": 1}, rows=table)  # fmt: skip


def test_rows_stay_within_the_budget_least_recently_used_first() -> None:
    one = _state("a", 1000).rows.nbytes  # type: ignore[union-attr]
    states = TableStates(rows_budget=int(one * 2.5))
    for uri in "abc":
        states.put(_state(uri, 1000))
    assert states.rows_bytes <= states.rows_budget
    a, b, c = (states.get(u) for u in "abc")
    assert a is not None and a.rows is None and a.files and a.transactions == {"app": 1}  # state kept, rows dropped
    assert b is not None and b.rows is not None and c is not None and c.rows is not None
    states.get("b")  # b used: c is now the least recent of the two with rows
    states.put(_state("d", 1000))
    assert states.get("c").rows is None and states.get("b").rows is not None  # type: ignore[union-attr]


def test_a_commit_replaces_files_rows_and_records_the_batch() -> None:
    states = TableStates()
    state = _state("t", 10)
    states.put(state)
    new_rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    states.committed(state, 7, {"new.parquet": 5}, new_rows, ("app", 9))
    got = states.get("t")
    assert got is not None and got.version == 7 and got.files == {"new.parquet": 5} and got.size == 5
    assert got.transactions["app"] == 9 and got.rows is new_rows
    assert states.rows_bytes == new_rows.nbytes
    states.forget("t")
    assert states.get("t") is None and states.rows_bytes == 0 and len(states) == 0


def test_routed_shards_have_states_of_their_own_forgotten_with_their_table() -> None:
    states = TableStates()
    a, b = _state("lake/t", 10), _state("lake/t", 20)
    a.key, b.key = "lake/t@db_a.t", "lake/t@db_b.t"
    other = _state("lake/t2", 5)
    for s in (a, b, other):
        states.put(s)
    assert states.get("lake/t@db_a.t") is a and states.get("lake/t@db_b.t") is b
    states.committed(a, 8, {"a.parquet": 1}, a.rows, ("app@db_a.t", 3))
    assert states.latest_known("lake/t") == 8  # b, at version 1, catches up before its next commit
    states.forget_key("lake/t@db_a.t")
    assert states.get("lake/t@db_a.t") is None and states.get("lake/t@db_b.t") is b
    states.forget("lake/t")  # a schema change of the shared table: every shard reads it again
    assert states.get("lake/t@db_b.t") is None and states.get("lake/t2") is other
    assert states.rows_bytes == other.rows.nbytes  # type: ignore[union-attr]


def test_live_size_leaves_out_the_rows_a_vector_deletes() -> None:
    from pyroaring import BitMap

    state = _state("t", 4)
    state.files = {"a.parquet": 1000, "b.parquet": 500}
    state.physical = {"a.parquet": 100, "b.parquet": 50}
    state.vectors = {"a.parquet": BitMap(range(75))}
    assert state.size == 1500 and state.live_size == 250 + 500
