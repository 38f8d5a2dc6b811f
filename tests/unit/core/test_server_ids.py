"""The server_id rule: the stream's block and the snapshot groups' block never share an id."""

from __future__ import annotations

import random

import pytest

from airflow_provider_mysqlcdc.core.server_ids import (
    DEFAULT_MAX_PARALLEL_GROUPS,
    DEFAULT_STREAM_READERS,
    ServerIdLayout,
    ServerIdRangeError,
    ServerIdSlots,
)


def test_blocks_are_disjoint_and_cover_the_range() -> None:
    layout = ServerIdLayout((5400, 6400), 6)
    assert layout.size == 1001
    assert list(layout.stream_block) == list(range(5400, 5406))
    assert layout.snapshot_block == range(5406, 6401)
    assert layout.max_groups == 995
    assert not set(layout.stream_block) & set(layout.snapshot_block)


@pytest.mark.parametrize("seed", range(20))
def test_every_reader_of_a_plan_has_its_own_id(seed: int) -> None:
    """Random ranges and reader counts: the stream's slots and every group a plan may make (at most
    ``max_groups``) get pairwise distinct ids, all inside the range."""
    rnd = random.Random(seed)
    lo = rnd.randint(1, 10_000)
    readers = rnd.randint(1, 64)
    parallel = rnd.randint(1, 64)
    size = readers + parallel + rnd.randint(0, 200)
    layout = ServerIdLayout((lo, lo + size - 1), readers)
    layout.check(parallel)
    ids = [layout.stream_id(i) for i in range(readers)] + [layout.group_id(g) for g in range(layout.max_groups)]
    assert len(ids) == len(set(ids)) == size
    assert all(lo <= i <= lo + size - 1 for i in ids)


def test_group_ids_wrap_modulo_the_snapshot_block() -> None:
    layout = ServerIdLayout((100, 109), 4)  # stream 100-103, snapshot 104-109 (6 ids)
    assert [layout.group_id(g) for g in range(8)] == [104, 105, 106, 107, 108, 109, 104, 105]
    # any max_groups consecutive groups are distinct, and never a stream id
    for start in range(20):
        window = [layout.group_id(g) for g in range(start, start + layout.max_groups)]
        assert len(set(window)) == layout.max_groups
        assert not set(window) & set(layout.stream_block)


def test_a_too_small_range_is_refused_with_the_numbers() -> None:
    layout = ServerIdLayout((5400, 5405), 6)
    with pytest.raises(ServerIdRangeError) as err:
        layout.check(4)
    msg = str(err.value)
    assert msg == (
        "server_id_range 5400-5405 has 6 ids; this pipeline needs 6 (stream readers) + 4 (parallel snapshot "
        "groups) = 10: widen it in the connection extra (e.g. 5400-5409) or lower stream_readers/max_parallel_groups"
    )
    ServerIdLayout((5400, 5409), 6).check(4)  # exactly enough


def test_defaults_fit_the_default_range() -> None:
    ServerIdLayout((5400, 6400), DEFAULT_STREAM_READERS).check(DEFAULT_MAX_PARALLEL_GROUPS)


def test_no_snapshot_id_when_the_stream_takes_the_whole_range() -> None:
    layout = ServerIdLayout((10, 13), 4)
    assert layout.max_groups == 0
    with pytest.raises(ServerIdRangeError, match="all taken by the 4 stream readers"):
        layout.group_id(0)
    with pytest.raises(ServerIdRangeError, match="slot 4"):
        layout.stream_id(4)


@pytest.mark.parametrize(("id_range", "readers"), [((0, 10), 1), ((10, 5), 1), ((1, 2**32), 1), ((1, 10), 0)])
def test_invalid_layouts(id_range: tuple[int, int], readers: int) -> None:
    with pytest.raises(ServerIdRangeError):
        ServerIdLayout(id_range, readers)


def test_slots_hand_out_the_lowest_free_id_and_reuse_released_ones() -> None:
    slots = ServerIdSlots(5400, 3)
    assert [slots.acquire("a"), slots.acquire("a"), slots.acquire("b")] == [5400, 5401, 5402]
    with pytest.raises(ServerIdRangeError, match="all 3 stream server_ids"):
        slots.acquire("c")
    assert slots.release("a") == 2
    assert slots.held == 1
    assert slots.acquire("c") == 5400  # a finished reader's slot is taken again
    assert slots.acquire("c") == 5401
    assert slots.release("nobody") == 0
    slots.release_all()
    assert slots.held == 0


def test_slots_never_give_a_held_id_twice() -> None:
    rnd = random.Random(7)
    slots = ServerIdSlots(100, 6)
    held: dict[int, str] = {}
    for step in range(2000):
        if held and (len(held) == 6 or rnd.random() < 0.4):
            owner = rnd.choice(sorted(set(held.values())))
            slots.release(owner)
            held = {i: o for i, o in held.items() if o != owner}
        else:
            owner = f"r{step % 5}"
            sid = slots.acquire(owner)
            assert sid not in held and 100 <= sid < 106
            held[sid] = owner
        assert slots.held == len(held)
