"""Where a micro-batch ends and how it is cut into parallel reads, from ``SHOW BINLOG EVENTS``.

The driver of the ``mysql_binlog`` source plans every micro-batch here without decoding a row:
:func:`capped_end` finds the last transaction boundary within the batch caps, and
:func:`slice_range` cuts ``[start, end)`` into sub-ranges of similar byte size, one per decoding
task. A cut falls on a transaction boundary where one is near; inside a large transaction it falls
on a rows event instead, so one huge transaction is decoded by several tasks too. Such a slice is
read from the start of its transaction (the TABLE_MAP events are there) and emits only the rows
events that start inside it; every change keeps its transaction's start offset, so the batch, the
handoff filter and the checkpoint still only ever see whole transactions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from airflow_provider_mysqlcdc.core.offset import BinlogOffset, binlog_file_number, binlog_segments

# SHOW BINLOG EVENTS event types that mark a transaction boundary.
_TX_START_TYPES = frozenset({"Gtid", "Anonymous_Gtid"})  # boundary at the event's start
_TX_END_TYPES = frozenset({"Xid", "XA_prepare"})  # boundary at the event's end
_WINDOW = 256  # events fetched per look-back window
_PAGE = 1000  # events fetched per forward page


# ============================================================================ boundaries (driver)
@dataclass(frozen=True)
class _Event:
    pos: int
    type: str
    end: int
    info: str


class BinlogBoundaries:
    """Transaction boundaries from ``SHOW BINLOG EVENTS``, without decoding a single row.

    The server walks its own file and skips events cheaply with ``LIMIT k, 1``, so finding "the
    k-th event after ``pos``" costs a round trip, and only small windows of event headers travel.
    A boundary is the start of a GTID event (MariaDB always writes one; MySQL a GTID or anonymous
    GTID) or the end of an ``Xid`` / ``XA_prepare`` / ``COMMIT`` / ``ROLLBACK``
    event: exactly the positions :class:`~.binlog_reader.BinlogRangeReader` stops at and starts from.
    ``SHOW BINLOG EVENTS ... FROM pos`` needs ``pos`` to be an event start: every base used here is
    a boundary, a file start (4), or a position the server itself listed.
    """

    def __init__(self, conn: Any):
        self.conn = conn
        self.queries = 0  # round trips, for tests and logs

    # ---------------------------------------------------------------- primitives
    def events(self, file: str, base: int, skip: int, count: int) -> list[_Event]:
        self.queries += 1
        with self.conn.cursor() as cur:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT %s, %s", (file, int(base), int(skip), int(count)))
            return [_Event(int(r[1]), str(r[2]), int(r[4]), str(r[5] or "")) for r in cur.fetchall()]

    def event(self, file: str, base: int, k: int) -> _Event | None:
        """The k-th event (0-based) from ``base``, or None past the end of the file."""
        got = self.events(file, base, k, 1)
        return got[0] if got else None

    def locate(
        self, file: str, base: int, target: int, known_above: int | None = None
    ) -> tuple[int, list[_Event]]:
        """``(n, window)``: ``n`` events from ``base`` start at a position <= ``target`` (>= 1, as
        ``base`` itself is an event start), and ``window`` holds the last few of them, ending with
        event ``n - 1`` — the look-back :meth:`last_boundary_before` needs, already fetched.

        Every probe restarts the server's walk at the last event known to start <= ``target``
        (``FROM`` that position), and probes are placed by interpolating positions — event sizes
        are similar, so a few probes land within :data:`_WINDOW` events — alternating with
        bisection so a skewed file still converges in O(log n) probes. ``known_above`` is an index
        already known to start after ``target``.
        """
        lo_i, lo_pos = 0, base  # event lo_i starts at lo_pos <= target
        hi_i: int | None = known_above  # event hi_i starts after target, or does not exist
        hi_pos: int | None = None
        avg: float | None = None  # bytes per event seen so far
        rounds = 0
        while hi_i is None or hi_i - lo_i > _WINDOW:
            rounds += 1
            if hi_i is None:
                if avg is None:
                    k = lo_i + _WINDOW
                else:  # aim just past the target, so the next probe brackets it
                    k = lo_i + max(_WINDOW, int((target - lo_pos) / avg * 1.05) + 1)
            elif hi_pos is not None and rounds % 2:
                k = lo_i + int((target - lo_pos) * (hi_i - lo_i) / (hi_pos - lo_pos))
                k = min(max(k, lo_i + 1), hi_i - 1)
            else:
                k = (lo_i + hi_i) // 2
            e = self.event(file, lo_pos, k - lo_i)
            if e is None or e.pos > target:
                hi_i, hi_pos = k, (None if e is None else e.pos)
            else:
                if e.pos > lo_pos:
                    avg = (e.pos - base) / k
                lo_i, lo_pos = k, e.pos
        window = self.events(file, lo_pos, 0, hi_i - lo_i)
        inside = [e for e in window if e.pos <= target]
        return lo_i + len(inside), inside

    # ---------------------------------------------------------------- boundaries
    @staticmethod
    def _boundaries_in(events: list[_Event], upto: int | None = None) -> list[int]:
        """Boundary positions contributed by ``events`` (a consecutive run), ascending, <= ``upto``."""
        out = []
        for e in events:
            if e.type in _TX_START_TYPES:
                b = e.pos
            elif e.type in _TX_END_TYPES or (e.type == "Query" and e.info.strip().upper() in ("COMMIT", "ROLLBACK")):
                b = e.end
            else:
                continue
            if upto is None or b <= upto:
                out.append(b)
        return out

    def last_boundary_before(
        self, file: str, base: int, k: int, pos_k: int, window: list[_Event] | None = None
    ) -> int | None:
        """The last boundary > ``base`` and <= ``pos_k``, the start of event ``k`` (so after whole
        events ``0..k-1``); None if the first transaction after ``base`` does not end by then.

        ``window`` (consecutive events ending with event ``k``; a GTID event ``k`` itself counts) is
        looked at first; the fallback reads growing windows before ``k`` from ``base``.
        """
        if window:
            found = [b for b in self._boundaries_in(window, pos_k) if b > base]
            if found:
                return found[-1]
        width = _WINDOW
        while True:
            lo = max(0, k - width)
            events = self.events(file, base, lo, k - lo + 1)
            found = [b for b in self._boundaries_in(events, pos_k) if b > base]
            if found:
                return found[-1]
            if lo == 0:
                return None
            width *= 8

    def first_boundary_from(self, file: str, pos: int, after: int, files: list[tuple[str, int]]) -> BinlogOffset | None:
        """The first boundary > ``after`` found scanning forward from event start ``pos``; a file
        end without one gives the next file's start; None at the end of the last file."""
        cur = pos
        while True:
            events = self.events(file, cur, 0, _PAGE)
            for e in events:
                if e.type == "Rotate":
                    nxt = e.info.split(";", 1)[0].strip()
                    if nxt:
                        return BinlogOffset(nxt, 4)
                found = [b for b in self._boundaries_in([e]) if b > after]
                if found:
                    return BinlogOffset(file, found[0])
            if len(events) < _PAGE:
                nxt_file = _next_file(files, file)
                return BinlogOffset(nxt_file, 4) if nxt_file else None
            cur = events[-1].end


def _next_file(files: list[tuple[str, int]], file: str) -> str | None:
    n = binlog_file_number(file)
    later = sorted((binlog_file_number(f), f) for f, _ in files if binlog_file_number(f) > n)
    return later[0][1] if later else None


def capped_end(
    bounds: BinlogBoundaries,
    files: list[tuple[str, int]],
    start: BinlogOffset,
    head: BinlogOffset,
    max_events: int | None,
    max_bytes: int | None,
) -> BinlogOffset:
    """The end of a batch from ``start``: the last boundary within the caps, never past ``head``.

    A transaction bigger than a cap forms a batch by itself (progress is guaranteed); a batch may
    span rotations (the caps are counted across files).
    """
    ev_left = max_events if max_events else math.inf
    by_left = max_bytes if max_bytes else math.inf
    consumed = False
    for f, base, seg_end in binlog_segments(files, start, head):
        k_cap: int | None = None
        pos_cap = 0
        window: list[_Event] | None = None
        if ev_left is not math.inf:
            e = bounds.event(f, base, int(ev_left))
            if e is not None and e.pos < seg_end:
                k_cap, pos_cap = int(ev_left), e.pos
        if by_left is not math.inf and base + by_left < seg_end:
            target = base + int(by_left)
            above = k_cap if k_cap is not None and pos_cap > target else None
            m, win = bounds.locate(f, base, target, known_above=above)
            # events 0..m-2 end at or before target: the batch may end where event m-1 starts
            if k_cap is None or m - 1 < k_cap:
                k_cap, pos_cap, window = m - 1, win[-1].pos, win
        if k_cap is None:
            if binlog_file_number(f) == head.file_number:
                return head
            if ev_left is not math.inf:
                ev_left -= bounds.locate(f, base, seg_end - 1, known_above=int(ev_left))[0]
            by_left -= seg_end - base
            consumed = True
            continue
        b = bounds.last_boundary_before(f, base, k_cap, pos_cap, window) if k_cap > 0 else None
        if b is not None:
            return min(BinlogOffset(f, b), head)
        if consumed:  # earlier files fill the batch; end it at this file's start
            return BinlogOffset(f, base)
        # The first transaction alone exceeds the cap: it is the batch.
        nxt = bounds.first_boundary_from(f, base, base, files)
        return head if nxt is None else min(nxt, head)
    return head


_ROWS_TYPES = ("Write_rows", "Update_rows", "Delete_rows")  # MariaDB adds "_v1"


@dataclass(frozen=True)
class RangeSlice:
    """One decoding task's share of a micro-batch.

    The task reads ``[start, end)`` (transaction boundaries) and emits the changes of the rows
    events that start in ``[emit_from, emit_to)``; ``None`` leaves that side open. Both are set
    only when the slice begins or ends inside a transaction (then ``start``/``end`` are that
    transaction's boundaries).
    """

    start: BinlogOffset
    end: BinlogOffset
    emit_from: BinlogOffset | None = None
    emit_to: BinlogOffset | None = None


@dataclass(frozen=True)
class _Cut:
    at: BinlogOffset  # a boundary, or the start of a rows event inside a transaction
    tx_start: BinlogOffset | None = None  # set for a cut inside a transaction
    tx_end: BinlogOffset | None = None

    @property
    def inside(self) -> bool:
        return self.tx_start is not None


def slice_range(
    bounds: BinlogBoundaries,
    files: list[tuple[str, int]],
    start: BinlogOffset,
    end: BinlogOffset,
    parts: int,
    min_bytes: int,
) -> list[RangeSlice]:
    """Up to ``parts`` slices of ``[start, end)`` of similar byte size (see the module doc).

    Each cut target snaps to the next transaction boundary when that is within a quarter of a
    slice; otherwise (the target lies deep inside a large transaction) the cut is the first rows
    event at or after the target.
    """
    segs = binlog_segments(files, start, end)
    total = sum(hi - lo for _, lo, hi in segs)
    if min_bytes > 0:
        parts = min(parts, max(1, total // min_bytes))
    if parts <= 1 or not segs:
        return [RangeSlice(start, end)]
    slack = max(1, total // parts // 4)
    cuts: dict[BinlogOffset, _Cut] = {}
    for i in range(1, parts):
        g = total * i // parts
        for seg_file, lo, hi in segs:
            if g < hi - lo:
                f, target, base = seg_file, lo + g, lo
                break
            g -= hi - lo
        else:  # pragma: no cover - g < total by construction
            continue
        cut = _cut_near(bounds, files, f, base, target, slack)
        if cut is not None and start < cut.at < end:
            cuts.setdefault(cut.at, cut)
    points = [_Cut(start), *(cuts[k] for k in sorted(cuts)), _Cut(end)]
    out = []
    for a, b in itertools.pairwise(points):
        out.append(RangeSlice(
            a.tx_start if a.inside else a.at,  # type: ignore[arg-type]
            b.tx_end if b.inside else b.at,  # type: ignore[arg-type]
            a.at if a.inside else None,
            b.at if b.inside else None,
        ))  # fmt: skip
    return out


def _cut_near(
    bounds: BinlogBoundaries, files: list[tuple[str, int]], f: str, base: int, target: int, slack: int
) -> _Cut | None:
    n, window = bounds.locate(f, base, target)
    e = window[-1]
    after = bounds.first_boundary_from(f, e.pos, max(base, e.pos - 1), files)
    if after is None:
        return None
    if after.file != f or after.pos - target <= slack:
        return _Cut(after)
    # Deep inside a transaction: cut at its next rows event, read the slice from the transaction's start.
    tx_start_pos = bounds.last_boundary_before(f, base, n - 1, e.pos, window)
    tx_start = BinlogOffset(f, tx_start_pos if tx_start_pos is not None else base)
    cur = e.pos
    while cur < after.pos:
        page = bounds.events(f, cur, 0, _WINDOW)
        for ev in page:
            if ev.pos >= after.pos:
                return _Cut(after)
            if ev.type.startswith(_ROWS_TYPES) and ev.pos > tx_start.pos:
                return _Cut(BinlogOffset(f, ev.pos), tx_start, after)
        if len(page) < _WINDOW:
            break
        cur = page[-1].end
    return _Cut(after)
