"""The handoff rule (``core.handoff.admit``) against a plain reference and against its invariant.

The invariant (``docs/architecture.md``, "The handoff" and "Invariants"): every chunk starts from
its snapshot, i.e. the source as of the chunk's high watermark; applying the admitted changes of
the binlog in order then yields the final source, with no change lost and none applied twice.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.change import RowChange
from airflow_provider_mysqlcdc.core.chunk import SnapshotChunk
from airflow_provider_mysqlcdc.core.chunking import splits_from_boundaries
from airflow_provider_mysqlcdc.core.handoff import HandoffFilter, admit
from airflow_provider_mysqlcdc.core.keys import KeyColumn
from airflow_provider_mysqlcdc.core.offset import BinlogOffset

TABLE = "shop.t"
OTHER = "shop.other"  # never captured
KEY = ("id",)
ID = (KeyColumn("id", keys.INT),)
# Binlog files whose suffix widens (999999 -> 1000000): offsets must compare numerically.
FILES = ("mysql-bin.999998", "mysql-bin.999999", "mysql-bin.1000000")
PER_FILE = 40  # positions per file in the model
TICKS = len(FILES) * PER_FILE
KEYS = st.integers(-60, 60)


def off(tick: int) -> BinlogOffset:
    """Model time -> binlog offset: consecutive ticks are consecutive positions, across files."""
    return BinlogOffset(FILES[tick // PER_FILE], 4 + 17 * (tick % PER_FILE))


class Model:
    """A table's chunks with their HWs, as the reference sees them: plain lists."""

    def __init__(self, bounds: list[int], hw_ticks: list[int]):
        self.chunks: list[SnapshotChunk] = splits_from_boundaries(TABLE, ID, [(b,) for b in bounds])
        self.hws = [off(t) for t in hw_ticks]
        self.hw_ticks = hw_ticks
        # the manifest's order is not the chunks' order: the filter sorts by split id
        pairs = list(zip(self.chunks, self.hws, strict=True))
        self.filter = HandoffFilter({TABLE: pairs[::-1]})
        self.bounds = bounds

    def __repr__(self) -> str:
        return f"Model(bounds={self.bounds}, hw_ticks={self.hw_ticks})"

    def chunk_of(self, k: int) -> int:
        """Linear scan: the chunk whose [start, end) holds ``k``."""
        hits = [
            i
            for i, c in enumerate(self.chunks)
            if (c.start is None or c.start[0] <= k) and (c.end is None or k < c.end[0])
        ]
        assert len(hits) == 1
        return hits[0]

    def newer(self, k: int, p: BinlogOffset) -> bool:
        """Whether a change at ``p`` to key ``k`` is not yet in the snapshot of ``k``'s chunk."""
        return p >= self.hws[self.chunk_of(k)]

    def reference(self, ch: RowChange) -> tuple[str, Any, Any] | None:
        """The handoff rule written plainly: (op, before, after) to emit, or None."""
        if ch.table != TABLE:
            return None
        p = ch.tx_offset
        if ch.op == "s":
            return ("s", ch.before, ch.after) if ch.after["kind"] == "alter" or p >= min(self.hws) else None  # type: ignore[index]
        if ch.op == "c":
            return ("c", None, ch.after) if self.newer(ch.after["id"], p) else None  # type: ignore[index]
        if ch.op == "d":
            return ("d", ch.before, None) if self.newer(ch.before["id"], p) else None  # type: ignore[index]
        delete_half = self.newer(ch.before["id"], p)  # type: ignore[index]
        upsert_half = self.newer(ch.after["id"], p)  # type: ignore[index]
        if delete_half and upsert_half:
            return ("u", ch.before, ch.after)
        if delete_half:
            return ("d", ch.before, None)
        if upsert_half:
            return ("u", None, ch.after)
        return None


@st.composite
def models(draw: st.DrawFn) -> Model:
    bounds = sorted(draw(st.sets(st.integers(-50, 50), max_size=6)))
    hws = draw(st.lists(st.integers(0, TICKS - 1), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
    return Model(bounds, hws)


def change(op: str, before: int | None, after: int | None, tick: int, value: int = 0, table: str = TABLE) -> RowChange:
    b = None if before is None else {"id": before, "v": value}
    a = None if after is None else {"id": after, "v": value}
    return RowChange(op, table, b, a, off(tick), (0, tick), 0, tick)  # type: ignore[arg-type]


@st.composite
def changes(draw: st.DrawFn) -> RowChange:
    op = draw(st.sampled_from("cud"))
    k1, k2, tick = draw(KEYS), draw(KEYS), draw(st.integers(0, TICKS - 1))
    return change(op, None if op == "c" else k1, None if op == "d" else k2, tick)


def _as_tuple(ch: RowChange | None) -> tuple[str, Any, Any] | None:
    return None if ch is None else (ch.op, ch.before, ch.after)


def _admit(ch: RowChange, m: Model) -> RowChange | None:
    got = admit(ch, m.filter, KEY, ch.tx_offset.sort_key())
    assert _as_tuple(admit(ch, m.filter, KEY)) == _as_tuple(got)  # tx_key is only a shortcut
    table = m.filter.table(ch.table)
    if table is not None and table.admits_every_row(ch.tx_offset.sort_key()):  # the per-event shortcut
        assert got is ch
    return got


# ------------------------------------------------------------------ admit == the plain rule
@settings(max_examples=300, deadline=None)
@given(models(), st.lists(changes(), min_size=1, max_size=20))
def test_admit_matches_the_plain_per_image_rule(m: Model, chs: list[RowChange]) -> None:
    for ch in chs:
        got = _admit(ch, m)
        want = m.reference(ch)
        assert _as_tuple(got) == want, (ch, m.hw_ticks)
        if want == (ch.op, ch.before, ch.after):
            assert got is ch  # passing whole allocates nothing
        if got is not None and got is not ch:  # a half keeps the change's place in the binlog
            assert (got.table, got.tx_offset, got.event_pos, got.row_index, got.commit_ts) == (
                ch.table, ch.tx_offset, ch.event_pos, ch.row_index, ch.commit_ts
            )  # fmt: skip
        if ch.op != "u":  # the per-key question agrees with the filter's own
            k = (ch.after or ch.before)["id"]  # type: ignore[index]
            assert m.filter.emits(TABLE, (k,), ch.tx_offset) == (want is not None)


@settings(max_examples=200, deadline=None)
@given(models(), st.data())
def test_a_change_at_hw_is_admitted_and_one_just_before_is_not(m: Model, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(m.chunks) - 1))
    c = m.chunks[i]
    lo = -1000 if c.start is None else c.start[0]
    hi = 1000 if c.end is None else c.end[0] - 1
    k = data.draw(st.integers(lo, hi))
    hw = m.hw_ticks[i]
    for op, before, after in (("c", None, k), ("d", k, None), ("u", k, k)):
        assert admit(change(op, before, after, hw), m.filter, KEY) is not None
        if hw > 0:
            assert admit(change(op, before, after, hw - 1), m.filter, KEY) is None


@settings(max_examples=200, deadline=None)
@given(models(), changes(), st.data())
def test_changes_at_or_after_the_max_hw_always_pass_whole(m: Model, ch: RowChange, data: st.DataObject) -> None:
    tick = data.draw(st.integers(max(m.hw_ticks), TICKS - 1))
    late = RowChange(ch.op, ch.table, ch.before, ch.after, off(tick), ch.event_pos)
    assert admit(late, m.filter, KEY) is late


@settings(max_examples=100, deadline=None)
@given(models(), changes())
def test_tables_not_captured_never_pass(m: Model, ch: RowChange) -> None:
    other = RowChange(ch.op, OTHER, ch.before, ch.after, off(TICKS - 1), ch.event_pos)
    assert admit(other, m.filter, KEY) is None
    assert admit(change("s", None, None, TICKS - 1, table=OTHER), m.filter, KEY) is None


def test_ddl_alters_always_pass_other_ddl_only_from_the_min_hw() -> None:
    m = Model([0, 10], [30, 20, 50])

    def ddl(kind: str, tick: int) -> RowChange:
        return RowChange("s", TABLE, None, {"kind": kind, "sql": "..."}, off(tick), (0, tick))

    assert admit(ddl("alter", 0), m.filter, KEY) is not None
    for kind in ("truncate", "drop", "rename", "replace"):
        assert admit(ddl(kind, 19), m.filter, KEY) is None  # in every chunk's snapshot already
        assert admit(ddl(kind, 20), m.filter, KEY) is not None
    for tick in (0, 19, 20, 49, 50):
        assert _as_tuple(admit(ddl("truncate", tick), m.filter, KEY)) == m.reference(ddl("truncate", tick))


def test_a_key_moving_between_chunks_keeps_only_the_half_newer_than_its_chunk() -> None:
    m = Model([10], [5, 50])  # chunk 0: keys < 10, HW at tick 5; chunk 1: keys >= 10, HW at tick 50
    into_new = change("u", 1, 20, 30, value=7)  # delete-half newer than chunk 0, upsert-half in chunk 1's snapshot
    assert _as_tuple(admit(into_new, m.filter, KEY)) == ("d", {"id": 1, "v": 7}, None)
    out_of_new = change("u", 20, 1, 30, value=7)  # the reverse: only the upsert-half is newer
    assert _as_tuple(admit(out_of_new, m.filter, KEY)) == ("u", None, {"id": 1, "v": 7})
    assert admit(change("u", 20, 30, 30), m.filter, KEY) is None  # both in chunk 1's snapshot


# ------------------------------------------------------------------ the invariant, end to end
@st.composite
def histories(draw: st.DrawFn) -> tuple[Model, list[RowChange], list[dict[int, int]]]:
    """A table's chunk map and a random valid history of changes; ``states[j]`` is the source before
    change ``j`` (``states[-1]``: after the last). Several changes may share a transaction."""
    m = draw(models())
    state = {k: -1 for k in draw(st.sets(KEYS, max_size=12))}  # rows older than every HW
    chs: list[RowChange] = []
    states = [dict(state)]
    tick = 0
    for n in range(draw(st.integers(0, 40))):
        tick += draw(st.integers(0, 6))  # 0: the same transaction as the previous change
        if tick >= TICKS:
            break
        absent = st.integers(-60, 60).filter(lambda k: k not in state)
        kinds = ["c"] + (["d", "u", "move"] if state else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "c":
            k = draw(absent)
            chs.append(change("c", None, k, tick, n))
            state[k] = n
        elif kind == "d":
            k = draw(st.sampled_from(sorted(state)))
            chs.append(change("d", k, None, tick, state.pop(k)))
        elif kind == "u":
            k = draw(st.sampled_from(sorted(state)))
            chs.append(RowChange("u", TABLE, {"id": k, "v": state[k]}, {"id": k, "v": n}, off(tick), (0, tick)))
            state[k] = n
        else:  # an update that changes the key: often into another chunk
            k = draw(st.sampled_from(sorted(state)))
            k2 = draw(absent)
            chs.append(RowChange("u", TABLE, {"id": k, "v": state.pop(k)}, {"id": k2, "v": n}, off(tick), (0, tick)))
            state[k2] = n
        states.append(dict(state))
    return m, chs, states


def _snapshot(m: Model, chs: list[RowChange], states: list[dict[int, int]]) -> dict[int, int]:
    """Every chunk read as of its HW: the source after the changes whose transaction starts before it."""
    out: dict[int, int] = {}
    for i, hw in enumerate(m.hws):
        before_hw = sum(1 for ch in chs if ch.tx_offset < hw)
        out.update({k: v for k, v in states[before_hw].items() if m.chunk_of(k) == i})
    return out


def _apply(sink: dict[int, int], ch: RowChange) -> None:
    """What the sink does with a change: delete the before key, upsert the after image."""
    if ch.before is not None and (ch.after is None or ch.before["id"] != ch.after["id"]):
        sink.pop(ch.before["id"], None)
    if ch.after is not None:
        sink[ch.after["id"]] = ch.after["v"]


@settings(max_examples=300, deadline=None)
@given(histories())
def test_snapshots_plus_admitted_changes_give_the_final_source(h: tuple[Model, list[RowChange], list[dict]]) -> None:
    m, chs, states = h
    sink = _snapshot(m, chs, states)
    for ch in chs:
        kept = _admit(ch, m)
        if kept is not None:
            _apply(sink, kept)
    assert sink == states[-1]


@settings(max_examples=200, deadline=None)
@given(models(), st.lists(changes(), min_size=1, max_size=20), st.integers(0, TICKS - 1))
def test_nothing_after_the_ddl_that_ended_capture_passes(m: Model, chs: list[RowChange], end: int) -> None:
    """A DROP/RENAME at ``end`` ended the table's capture: later changes are another table's."""
    pairs = list(zip(m.chunks, m.hws, strict=True))
    ended = HandoffFilter({TABLE: pairs}, None, {TABLE: off(end)})
    for ch in chs:
        got = admit(ch, ended, KEY)
        whole = ended.table(TABLE).admits_every_row(ch.tx_offset.sort_key())  # type: ignore[union-attr]
        assert whole == (ch.tx_offset <= off(end) and ch.tx_offset >= max(m.hws))
        if whole:
            assert got is ch
        if ch.tx_offset > off(end):
            assert got is None
        else:
            assert _as_tuple(got) == m.reference(ch)
        assert ended.emits(TABLE, [0], ch.tx_offset) == (ch.tx_offset <= off(end) and m.newer(0, ch.tx_offset))
    drop = RowChange("s", TABLE, None, {"kind": "drop", "sql": "DROP TABLE t"}, off(end), (0, end))
    assert _as_tuple(admit(drop, ended, KEY)) == m.reference(drop)  # the ending DDL itself is judged as before
