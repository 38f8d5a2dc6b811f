"""Per-chunk windows (``core.chunk_window.ChunkWindows``) against the invariant they exist for.

Each chunk of a group is read at some moment inside its own ``[LW, HW)``; replaying the parts of
the group's binlog window that :meth:`ChunkWindows.part` keeps onto the rows it read must give the
chunk exactly as the source held it at its HW — and the handoff then takes over from that HW.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.change import RowChange
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.chunk_window import ChunkWindows
from airflow_provider_mysqlcdc.core.chunking import splits_from_boundaries
from airflow_provider_mysqlcdc.core.keys import KeyColumn
from airflow_provider_mysqlcdc.core.offset import BinlogOffset

TABLE = "shop.t"
KEY = ("id",)
ID = (KeyColumn("id", keys.INT),)
FILES = ("mysql-bin.000009", "mysql-bin.000010")  # the window may cross a rotation
PER_FILE = 30
TICKS = len(FILES) * PER_FILE
KEYS = st.integers(-30, 30)


def off(tick: int) -> BinlogOffset:
    return BinlogOffset(FILES[tick // PER_FILE], 4 + 11 * (tick % PER_FILE))


def change(op: str, before: int | None, after: int | None, tick: int, value: int = 0) -> RowChange:
    b = None if before is None else {"id": before, "v": value}
    a = None if after is None else {"id": after, "v": value}
    return RowChange(op, TABLE, b, a, off(tick), (0, tick), 0, tick)  # type: ignore[arg-type]


def apply(state: dict[int, int], ch: RowChange) -> None:
    if ch.before is not None:
        state.pop(ch.before["id"], None)
    if ch.after is not None:
        state[ch.after["id"]] = ch.after["v"]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list, list[tuple[int, int, int]], set[int], list[RowChange], dict[int, int]]:
    """Chunks, each group chunk's (LW, read, HW) ticks, which chunks are the group's, a valid history
    (one change per tick) and the rows older than every tick."""
    bounds = sorted(draw(st.sets(st.integers(-25, 25), max_size=5)))
    chunks = splits_from_boundaries(TABLE, ID, [(b,) for b in bounds])
    group = set(draw(st.sets(st.sampled_from([c.split_id for c in chunks]), min_size=1)))
    brackets = []
    for _ in chunks:
        lw = draw(st.integers(0, TICKS - 2))
        read = draw(st.integers(lw, TICKS - 2))
        hw = draw(st.integers(read, TICKS - 1))
        brackets.append((lw, read, hw))
    state = {k: -1 for k in draw(st.sets(KEYS, max_size=10))}
    start = dict(state)
    history = []
    for tick in range(TICKS):
        if not draw(st.booleans()):
            continue
        present = sorted(state)
        op = draw(st.sampled_from("cud" if present else "c"))
        value = draw(st.integers(0, 9))
        if op == "c":
            k = draw(st.sampled_from(sorted(set(range(-30, 31)) - set(state))))
            ch = change("c", None, k, tick, value)
        elif op == "d":
            ch = change("d", draw(st.sampled_from(present)), None, tick)
        else:  # an update, perhaps moving the key (into another chunk, even another group's)
            old = draw(st.sampled_from(present))
            taken = set(state) - {old}
            new = draw(st.sampled_from(sorted(set(range(-30, 31)) - taken)))
            ch = change("u", old, new, tick, value)
        apply(state, ch)
        history.append(ch)
    return chunks, brackets, group, history, start


def state_at(start: dict[int, int], history: list[RowChange], tick: int) -> dict[int, int]:
    """The source before the change at ``tick`` (what a read view taken at ``tick`` sees)."""
    s = dict(start)
    for ch in history:
        if ch.tx_offset.sort_key() < off(tick).sort_key():
            apply(s, ch)
    return s


Scenario = tuple[list, list[tuple[int, int, int]], set[int], list[RowChange], dict[int, int]]


Windows = dict[int, tuple[BinlogOffset, BinlogOffset]]


def group_windows(scenario: Scenario) -> tuple[ChunkLocator, Windows, ChunkWindows]:
    """The scenario's chunk locator, each group chunk's (LW, HW), and the windows built from them."""
    chunks, brackets, group, _, _ = scenario
    locator = ChunkLocator(chunks)
    own = {c.split_id: (off(b[0]), off(b[2])) for c, b in zip(chunks, brackets, strict=True) if c.split_id in group}
    return locator, own, ChunkWindows(locator, own)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_a_chunk_read_inside_its_window_plus_its_replayed_part_equals_the_source_at_its_hw(
    scenario: Scenario,
) -> None:
    chunks, brackets, group, history, start = scenario
    locator, _, windows = group_windows(scenario)
    kept = [p for p in (windows.part(ch, KEY) for ch in history) if p is not None]
    for i, c in enumerate(chunks):
        if c.split_id not in group:
            continue
        _, read, hw = brackets[i]
        rows = {k: v for k, v in state_at(start, history, read).items() if locator.index_of((k,)) == i}
        for p in kept:  # the group's replay: images of this chunk's keys only
            if p.before is not None and locator.index_of((p.before["id"],)) == i:
                rows.pop(p.before["id"], None)
            if p.after is not None and locator.index_of((p.after["id"],)) == i:
                rows[p.after["id"]] = p.after["v"]
        want = {k: v for k, v in state_at(start, history, hw).items() if locator.index_of((k,)) == i}
        assert rows == want, (c.split_id, brackets[i])


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_nothing_outside_every_window_or_of_another_groups_keys_is_kept(
    scenario: Scenario,
) -> None:
    history = scenario[3]
    locator, own, windows = group_windows(scenario)
    for ch in history:
        p = windows.part(ch, KEY)
        for image in (p.before, p.after) if p is not None else ():
            if image is None:
                continue
            lw, hw = own.get(locator.locate((image["id"],)).split_id, (None, None))
            assert lw is not None and lw <= ch.tx_offset < hw


def test_a_key_moving_between_chunks_keeps_only_the_half_inside_its_chunks_window() -> None:
    chunks = splits_from_boundaries(TABLE, ID, [(10,)])  # keys < 10 | keys >= 10
    windows = ChunkWindows(ChunkLocator(chunks), {chunks[0].split_id: (off(0), off(5)),
                                                  chunks[1].split_id: (off(5), off(9))})  # fmt: skip
    assert windows.part(change("u", 1, 20, 3, 7), KEY).op == "d"  # type: ignore[union-attr]
    half = windows.part(change("u", 1, 20, 6, 7), KEY)
    assert half is not None and (half.op, half.before, half.after) == ("u", None, {"id": 20, "v": 7})
    assert windows.part(change("u", 1, 2, 5, 7), KEY) is None  # chunk 0's HW: the stream's
    whole = change("u", 12, 14, 8, 7)
    assert windows.part(whole, KEY) is whole
    assert windows.part(change("c", None, 3, 4), KEY) is not None
    assert windows.part(change("c", None, 3, 9), KEY) is None  # at the group's end
