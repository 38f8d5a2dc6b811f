"""``fold_changes``: one micro-batch of one table -> upserts + delete keys, last change per key wins.

The properties compare the fold with two naive models over random op sequences:

* a *source* simulation — a dict standing for the MySQL table, driven only by changes MySQL could
  log (insert of an absent key, update/delete of a present key, key moves to absent keys); applying
  the fold's output to the sink's state before the batch must give exactly the source after it;
* a *replay* model — every change applied to a dict one after another; the fold applied in one
  step must give the same dict, also for sequences MySQL could not produce (duplicate inserts,
  updates of absent keys), so the fold has no hidden assumption about validity.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.reference_fold import fold_changes, keys_to_arrow

PK = ["a", "b"]
# A tiny key space forces collisions; 'x', 'X' and 'x ' are equal under a case- and pad-insensitive
# collation but distinct stored values, and must stay distinct here (binary identity).
A_VALUES = [0, 1, 2]
B_VALUES = ["x", "X", "x "]
KEYS = [(a, b) for a in A_VALUES for b in B_VALUES]


def _row(key: tuple[Any, ...], v: int) -> dict[str, Any]:
    return {"a": key[0], "b": key[1], "v": v}


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["a"], row["b"])


def _apply_fold(state: dict[tuple[Any, ...], dict[str, Any]], changes: list[Any]) -> dict[tuple[Any, ...], Any]:
    upserts, deletes = fold_changes(changes, PK)
    out = dict(state)
    for k in deletes:
        out.pop(k, None)
    for r in upserts:
        out[_key(r)] = r
    return out


def _replay(state: dict[tuple[Any, ...], dict[str, Any]], changes: list[Any]) -> dict[tuple[Any, ...], Any]:
    out = dict(state)
    for op, before, after in changes:
        if op == "c":
            out[_key(after)] = after
        elif op == "u":
            out.pop(_key(before), None)
            out[_key(after)] = after
        else:
            out.pop(_key(before), None)
    return out


initial_states = st.dictionaries(st.sampled_from(KEYS), st.integers(0, 9)).map(
    lambda d: {k: _row(k, v) for k, v in d.items()}
)
intents = st.lists(
    st.tuples(st.sampled_from(["c", "u", "d"]), st.sampled_from(KEYS), st.sampled_from(KEYS), st.integers(0, 99)),
    max_size=40,
)


def _valid_changes(source: dict[tuple[Any, ...], Any], intents: list[Any]) -> list[Any]:
    """Turn random intents into a change log MySQL could write, mutating ``source`` along the way."""
    changes: list[Any] = []
    for op, k, k2, v in intents:
        if op == "c" and k not in source:
            after = _row(k, v)
            source[k] = after
            changes.append(("c", None, after))
        elif op == "u" and k in source:
            new_key = k2 if k2 not in source else k  # a key move only to a free key
            before, after = source.pop(k), _row(new_key, v)
            source[new_key] = after
            changes.append(("u", before, after))
        elif op == "d" and k in source:
            changes.append(("d", source.pop(k), None))
    return changes


@settings(max_examples=400, deadline=None)
@given(initial_states, intents)
def test_fold_turns_the_sink_into_the_source(initial: dict[tuple[Any, ...], Any], intents: list[Any]) -> None:
    source = dict(initial)  # the sink holds the source as of the batch start
    changes = _valid_changes(source, intents)
    assert _apply_fold(initial, changes) == source
    assert _apply_fold(initial, changes) == _replay(initial, changes)


@settings(max_examples=400, deadline=None)
@given(initial_states, intents)
def test_fold_equals_replay_for_any_sequence(initial: dict[tuple[Any, ...], Any], intents: list[Any]) -> None:
    changes = []
    for op, k, k2, v in intents:
        if op == "c":
            changes.append(("c", None, _row(k, v)))
        elif op == "u":
            changes.append(("u", _row(k, v), _row(k2, v + 1)))
        else:
            changes.append(("d", _row(k, v), None))
    assert _apply_fold(initial, changes) == _replay(initial, changes)


@settings(max_examples=300, deadline=None)
@given(initial_states, intents)
def test_each_key_at_most_once_and_only_touched_keys(initial: dict[tuple[Any, ...], Any], intents: list[Any]) -> None:
    changes = _valid_changes(dict(initial), intents)
    upserts, deletes = fold_changes(changes, PK)
    up_keys = [_key(r) for r in upserts]
    assert len(set(up_keys)) == len(up_keys)
    assert len(set(deletes)) == len(deletes)
    assert not set(up_keys) & set(deletes), "a key must be either upserted or deleted, never both"
    touched = {_key(i) for _, b, a in changes for i in (b, a) if i is not None}
    assert set(up_keys) | set(deletes) <= touched


def test_last_change_per_key_wins() -> None:
    k = (1, "x")
    changes = [("c", None, _row(k, 1)), ("u", _row(k, 1), _row(k, 2)), ("u", _row(k, 2), _row(k, 3))]
    assert fold_changes(changes, PK) == ([_row(k, 3)], [])


def test_insert_after_delete_is_an_upsert_and_delete_after_insert_is_a_delete() -> None:
    k, j = (1, "x"), (2, "x")
    changes = [("d", _row(k, 1), None), ("c", None, _row(k, 2)), ("c", None, _row(j, 3)), ("d", _row(j, 3), None)]
    assert fold_changes(changes, PK) == ([_row(k, 2)], [j])


def test_key_move_deletes_the_old_key_and_upserts_the_new_one() -> None:
    old, new = (1, "x"), (2, "x")
    assert fold_changes([("u", _row(old, 1), _row(new, 1))], PK) == ([_row(new, 1)], [old])
    # moving back within the batch: the old key ends as an upsert, the intermediate key deleted
    back = [("u", _row(old, 1), _row(new, 1)), ("u", _row(new, 1), _row(old, 2))]
    assert fold_changes(back, PK) == ([_row(old, 2)], [new])


def test_keys_compare_by_exact_value_not_collation() -> None:
    lower, upper, padded = (1, "x"), (1, "X"), (1, "x ")
    changes = [("d", _row(lower, 1), None), ("c", None, _row(upper, 2)), ("u", _row(padded, 3), _row(padded, 4))]
    upserts, deletes = fold_changes(changes, PK)
    assert deletes == [lower]
    assert upserts == [_row(upper, 2), _row(padded, 4)]


def test_results_follow_the_order_of_each_keys_last_change() -> None:
    k1, k2, k3 = (1, "x"), (2, "x"), (3, "x")
    changes = [
        ("c", None, _row(k1, 1)),
        ("c", None, _row(k2, 1)),
        ("d", _row(k3, 1), None),
        ("u", _row(k1, 1), _row(k1, 2)),
    ]
    upserts, _ = fold_changes(changes, PK)
    assert [_key(r) for r in upserts] == [k2, k1]


def test_output_rows_are_copies() -> None:
    row = _row((1, "x"), 1)
    upserts, _ = fold_changes([("c", None, row)], PK)
    row["v"] = 99
    assert upserts[0]["v"] == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("x", None, {"a": 1, "b": "x"}), "unknown op"),
        (("c", None, None), "no after image"),
        (("u", None, {"a": 1, "b": "x"}), "no before image"),
        (("d", None, None), "no before image"),
        (("c", None, {"a": 1}), "key column 'b' is missing"),
    ],
)
def test_bad_changes_are_refused(change: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fold_changes([change], PK)


def test_no_primary_key_is_refused() -> None:
    with pytest.raises(ValueError, match="primary key"):
        fold_changes([], [])


def test_keys_to_arrow_uses_the_table_types() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int32())])
    t = keys_to_arrow([(1, "x"), (2, "X")], PK, schema)
    assert t.schema == pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert t.to_pylist() == [{"a": 1, "b": "x"}, {"a": 2, "b": "X"}]
    assert keys_to_arrow([], PK, schema).num_rows == 0
