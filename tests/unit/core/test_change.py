"""RowChange ordering, and the reference fold over RowChange objects (tests/support/reference_fold.py)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.change import RowChange, RowsEventChanges
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from tests.support.reference_fold import last_change_per_key

TX = BinlogOffset("mysql-bin.000001", 100)
_pos = iter(range(1000, 10**9, 100))


def ins(row: dict[str, Any], pos: int | None = None) -> RowChange:
    return RowChange("c", "db.t", None, row, TX, (1, pos or next(_pos)))


def upd(before: dict[str, Any], after: dict[str, Any], pos: int | None = None) -> RowChange:
    return RowChange("u", "db.t", before, after, TX, (1, pos or next(_pos)))


def dele(row: dict[str, Any], pos: int | None = None) -> RowChange:
    return RowChange("d", "db.t", row, None, TX, (1, pos or next(_pos)))


def final_state(folded: dict[Any, RowChange]) -> dict[Any, dict[str, Any] | None]:
    """The fold's meaning for a consumer: key -> final row, or None when the key ends deleted."""
    return {k: ch.after for k, ch in folded.items()}


def test_order_key_orders_by_file_then_position_then_row() -> None:
    a = RowChange("c", "db.t", None, {"id": 1}, TX, (9, 999_999), row_index=5)
    b = RowChange("c", "db.t", None, {"id": 2}, TX, (10, 4), row_index=0)
    c = RowChange("c", "db.t", None, {"id": 3}, TX, (10, 4), row_index=1)
    assert sorted([c, b, a], key=lambda ch: ch.order_key) == [a, b, c]


def test_row_change_has_slots() -> None:
    ch = ins({"id": 1})
    assert not hasattr(ch, "__dict__")
    with pytest.raises(AttributeError):
        ch.extra = 1  # type: ignore[attr-defined]


def test_key_reads_the_requested_image() -> None:
    ch = upd({"id": 1, "v": "a"}, {"id": 2, "v": "a"})
    assert ch.key(["id"]) == (2,)  # default: after image
    assert ch.key(["id"], "before") == (1,)
    assert dele({"id": 7}).key(["id"]) == (7,)
    with pytest.raises(ValueError, match="no after image"):
        dele({"id": 7}).key(["id"], "after")
    with pytest.raises(KeyError, match="'nope' is not in the row image"):
        ins({"id": 1}).key(["nope"])


def test_last_change_wins_per_key() -> None:
    changes = [
        ins({"id": 1, "v": "a"}),
        ins({"id": 2, "v": "b"}),
        upd({"id": 1, "v": "a"}, {"id": 1, "v": "a2"}),
        upd({"id": 1, "v": "a2"}, {"id": 1, "v": "a3"}),
        dele({"id": 2, "v": "b"}),
    ]
    assert final_state(last_change_per_key(changes, ["id"])) == {(1,): {"id": 1, "v": "a3"}, (2,): None}


def test_delete_then_reinsert_ends_present() -> None:
    changes = [dele({"id": 1, "v": "old"}), ins({"id": 1, "v": "new"})]
    assert final_state(last_change_per_key(changes, ["id"])) == {(1,): {"id": 1, "v": "new"}}


def test_pk_changing_update_deletes_old_key_and_upserts_new_key() -> None:
    move = upd({"id": 1, "v": "x"}, {"id": 10, "v": "x"})
    folded = last_change_per_key([move], ["id"])
    assert final_state(folded) == {(1,): None, (10,): {"id": 10, "v": "x"}}
    old = folded[(1,)]
    assert old.op == "d" and old.before == {"id": 1, "v": "x"}
    assert old.tx_offset == move.tx_offset and old.order_key == move.order_key
    assert folded[(10,)] is move


def test_key_moving_away_and_back() -> None:
    changes = [
        upd({"id": 1, "v": "x"}, {"id": 2, "v": "x"}),
        upd({"id": 2, "v": "x"}, {"id": 1, "v": "y"}),
    ]
    assert final_state(last_change_per_key(changes, ["id"])) == {(1,): {"id": 1, "v": "y"}, (2,): None}


def test_insert_into_key_vacated_earlier_in_window() -> None:
    # Row 1 moves to 5, then a new row takes key 1: both keys end present.
    changes = [upd({"id": 1, "v": "a"}, {"id": 5, "v": "a"}), ins({"id": 1, "v": "b"})]
    assert final_state(last_change_per_key(changes, ["id"])) == {(1,): {"id": 1, "v": "b"}, (5,): {"id": 5, "v": "a"}}


def test_composite_keys() -> None:
    changes = [
        ins({"a": 1, "b": "x", "v": 0}),
        upd({"a": 1, "b": "x", "v": 0}, {"a": 1, "b": "y", "v": 0}),
        ins({"a": 2, "b": "x", "v": 1}),
    ]
    assert final_state(last_change_per_key(changes, ["a", "b"])) == {
        (1, "x"): None,
        (1, "y"): {"a": 1, "b": "y", "v": 0},
        (2, "x"): {"a": 2, "b": "x", "v": 1},
    }


def test_result_is_ordered_by_each_keys_last_change() -> None:
    changes = [ins({"id": 1}), ins({"id": 2}), upd({"id": 1}, {"id": 1})]
    assert list(last_change_per_key(changes, ["id"])) == [(2,), (1,)]


def test_normalize_folds_keys_the_database_considers_equal() -> None:
    # Under a case-insensitive collation 'a' and 'A' are one row: delete 'a' then insert 'A' must
    # leave exactly one entry whose final row is 'A', not a deletion that may be applied after it.
    changes = [dele({"k": "a", "v": 1}), ins({"k": "A", "v": 2})]
    raw = last_change_per_key(changes, ["k"])
    assert set(raw) == {("a",), ("A",)}
    folded = last_change_per_key(changes, ["k"], normalize=lambda key: tuple(str(x).lower() for x in key))
    assert final_state(folded) == {("a",): {"k": "A", "v": 2}}


def test_case_only_update_under_normalize_is_not_a_key_move() -> None:
    ch = upd({"k": "a", "v": 1}, {"k": "A", "v": 1})
    folded = last_change_per_key([ch], ["k"], normalize=lambda key: tuple(str(x).lower() for x in key))
    assert final_state(folded) == {("a",): {"k": "A", "v": 1}}


def test_null_and_missing_images_are_rejected() -> None:
    bad = RowChange("u", "db.t", None, {"id": 1}, TX, (1, 5))
    with pytest.raises(ValueError, match="no before image"):
        last_change_per_key([bad], ["id"])
    odd = RowChange("x", "db.t", {"id": 1}, None, TX, (1, 5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown row change op"):
        last_change_per_key([odd], ["id"])


def test_empty_input() -> None:
    assert last_change_per_key([], ["id"]) == {}


def test_rows_event_changes_give_each_row_with_its_index() -> None:
    tx = BinlogOffset("mysql-bin.000002", 400)
    pairs = [({"id": 1}, {"id": 1, "v": "a"}), ({"id": 2}, {"id": 20, "v": "b"}), ({"id": 3}, {"id": 3, "v": "c"})]
    event = RowsEventChanges("u", "db.t", pairs, tx, (2, 500), 1700000000)
    assert [(c.op, c.before, c.after, c.row_index) for c in event.changes()] == [
        ("u", b, a, i) for i, (b, a) in enumerate(pairs)
    ]
    befores, afters = event.befores_afters()
    assert list(befores) == [b for b, _ in pairs] and list(afters) == [a for _, a in pairs]
    rest = event.without_first(2)  # rows already handled are left out, the indexes stay the event's
    assert [(c.before, c.row_index, c.tx_offset, c.event_pos, c.commit_ts) for c in rest.changes()] == [
        ({"id": 3}, 2, tx, (2, 500), 1700000000)
    ]
    assert rest.befores_afters() == ((pairs[2][0],), (pairs[2][1],))
    assert event.without_first(3).befores_afters() == ((), ())


@pytest.mark.parametrize("op", ["c", "d"])
def test_rows_event_changes_of_inserts_and_deletes_have_one_image(op: str) -> None:
    images = [{"id": 1}, {"id": 2}]
    event = RowsEventChanges(op, "db.t", images, BinlogOffset("f.000001", 4), (1, 9))  # type: ignore[arg-type]
    befores, afters = event.befores_afters()
    if op == "c":
        assert list(befores) == [None, None] and list(afters) == images
    else:
        assert list(befores) == images and list(afters) == [None, None]
    assert [(c.before, c.after) for c in event.changes()] == list(zip(befores, afters, strict=True))
