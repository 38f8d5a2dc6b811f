"""``verify``: prove that the lake equals the source, chunk by chunk, while the stream runs.

The comparison is made at one consistent point without stopping anything (docs/architecture.md,
"Verify"):

1. open a consistent-snapshot transaction on the source; its binlog offset is O. Every chunk's
   row count and digest sum are computed there, by the server (``mysql/chunk_digests.py``);
2. wait until the stream's checkpoint has reached O: the lake then holds every change up to O. A
   stream that is not running (stopped, failed, lost) fails this at once, before and while waiting,
   with its state and the fix: its lake will not move;
3. read each captured table from the lake, then the source's current end E: whatever the lake
   shows happened before E;
4. read the binlog ``(O, E]`` for the tables: the keys changed there are *in flight* — the source
   snapshot shows them before, the lake maybe after. Their rows are taken out of both sides
   (on the source by their own digests, read in the same snapshot), so every other row must be
   identical; the in-flight rows are counted and left to the next run;
5. compare per chunk; a chunk whose count or digest differs is reported with its key range.

One scan of each table per side. The binlog reader uses the last server_id of the connection's
range, which only the last of a full set of snapshot groups would use: do not run ``verify`` while
a plan's snapshot tasks run (the example DAG runs it after them).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.row_digest import (
    ChunkDigest,
    DigestPlan,
    TableVerdict,
    compare_chunks,
    format_verdicts,
    lake_chunk_digests,
    normal_key,
)
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.chunk_digests import source_chunk_digests, source_row_digests
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.server import begin_consistent_snapshot, current_offset
from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import checkpoint_offset, stream_state, watch_condition

log = logging.getLogger(__name__)


class VerifyError(RuntimeError):
    """verify could not compare (nothing captured, an unknown table, the stream not catching up)."""


@dataclass
class VerifyReport:
    source_offset: BinlogOffset
    lake_reached: BinlogOffset
    verdicts: list[TableVerdict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def summary(self) -> str:
        head = (f"verify at source offset {self.source_offset} (lake caught up to {self.lake_reached}): "
                + ("every table matches" if self.ok else
                   f"{sum(not v.ok for v in self.verdicts)} table(s) differ"))  # fmt: skip
        lines = [head, format_verdicts(self.verdicts)]
        for v in self.verdicts:
            for d in v.details:
                lines.append(f"  {v.table} chunk {d['chunk']} {d['range']}: source {d['source_rows']} rows, "
                             f"lake {d['lake_rows']} rows, contents differ")  # fmt: skip
        if not self.ok:
            lines.append(f"repair them, with the stream running: trigger the DAG with repair_chunks="
                         f"{json.dumps(self.repair_chunks)}")  # fmt: skip
        return "\n".join(lines)

    @property
    def repair_chunks(self) -> dict[str, list[int]]:
        """The differing chunks, as the ``repair_chunks`` param takes them."""
        return {v.table: list(v.differing) for v in self.verdicts if v.differing}

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "source_offset": str(self.source_offset), "lake_reached": str(self.lake_reached),
                "tables": [v.to_dict() for v in self.verdicts], "repair_chunks": self.repair_chunks,
                "seconds": self.seconds}  # fmt: skip


def verify_pipeline(
    settings: ConnectionSettings,
    store: StateStore,
    sink: DeltaSink,
    tables: Sequence[str] | None = None,
    *,
    wait_timeout: float = 600.0,
    progress: Callable[[str], None] = log.info,
) -> VerifyReport:
    """Compare ``tables`` (default: every captured table) of the source and the lake (module doc)."""
    manifest = store.read_manifest()
    if manifest is None or not manifest.tables:
        raise VerifyError(f"pipeline {store.pipeline_id!r} has captured nothing yet: run the DAG first")
    sink.routes = manifest.selection.routing  # a routed table is compared with its shard's rows
    names = list(tables) if tables else sorted(t for t, e in manifest.tables.items() if e.ended_at is None)
    unknown = [t for t in names if t not in manifest.tables]
    if unknown:
        raise VerifyError(f"{unknown} are not captured by pipeline {store.pipeline_id!r} (captured: "
                          f"{sorted(manifest.tables)})")  # fmt: skip
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    conn = settings.connect()
    try:
        at = begin_consistent_snapshot(conn)
        at = BinlogOffset(at.file, at.pos)
        _stream_reaches(store, manifest, at)  # a stream that is not running will not: say so now
        progress(f"source snapshot at {at}: computing chunk digests on the server for {len(names)} table(s)")
        plans = {t: DigestPlan.of(manifest.tables[t].source_schema) for t in names}
        splits = {t: _splits(manifest.tables[t]) for t in names}
        chunk_of = {t: ChunkLocator(splits[t], manifest.collations).indexes_of for t in names}

        cancelled = threading.Event()

        def source_side() -> dict[str, list[ChunkDigest]]:
            out = {}
            for t in names:
                if cancelled.is_set():
                    raise VerifyError("cancelled")
                out[t] = source_chunk_digests(conn, t, splits[t], plans[t], manifest.collations)
                progress(f"{t}: {len(out[t])} chunks, {sum(d.rows for d in out[t]):,} rows at the source")
            timings["source_s"] = round(time.monotonic() - t0, 3)
            return out

        # The server computes its side while this process waits for the stream and digests the lake.
        with ThreadPoolExecutor(1, thread_name_prefix="verify-source") as pool:
            pending = pool.submit(source_side)
            try:
                reached = _wait_for_stream(store, manifest, at, wait_timeout, progress)
            except VerifyError:
                cancelled.set()  # answer now, not once the server has digested every table
                _kill_query(settings, conn.thread_id())
                raise
            t1 = time.monotonic()
            lake = {t: sink.read(t) for t in names}
            with settings.connect() as probe:
                end = current_offset(probe)
            end = BinlogOffset(end.file, end.pos)
            timings["lake_read_s"] = round(time.monotonic() - t1, 3)
            t2 = time.monotonic()
            moved = _changed_keys(settings, manifest, names, at, end)
            progress(f"binlog {at}..{end}: {sum(len(k) for k in moved.values())} key(s) changed while verifying")
            lake_digests = {}
            for t in names:
                lake_digests[t], _ = lake_chunk_digests(lake[t], plans[t], chunk_of[t],
                                                        manifest.tables[t].chunk_key_columns, len(splits[t]), moved[t])
                lake[t] = None  # type: ignore[assignment]  # release the rows
            timings["lake_digest_s"] = round(time.monotonic() - t2, 3)
            source = pending.result()

        t3 = time.monotonic()
        verdicts = []
        for t in names:
            src = [ChunkDigest(d.rows, d.digest) for d in source[t]]
            if moved[t]:  # take the in-flight rows out of the source side, by their own digests
                keys = splits[t][0].key_columns
                digests = source_row_digests(conn, t, keys, moved[t], plans[t], manifest.collations)
                for key, idx in zip(digests, chunk_of[t](list(digests)), strict=True):
                    src[idx].add(digests[key], sign=-1)
            verdict = compare_chunks(t, src, lake_digests[t], [_bounds(s) for s in splits[t]])
            verdict.in_flight_keys = len(moved[t])
            verdict.unchecked_columns = dict(plans[t].unchecked)
            verdicts.append(verdict)
            progress(f"{t}: {'matches' if verdict.ok else f'{len(verdict.differing)} chunk(s) differ'}")
        timings["compare_s"] = round(time.monotonic() - t3, 3)
        timings["total_s"] = round(time.monotonic() - t0, 3)
        return VerifyReport(at, reached, verdicts, timings)
    finally:
        try:
            conn.rollback()
        finally:
            conn.close()


def _splits(captured: CapturedTable) -> list[Any]:
    return sorted((c.chunk for c in captured.chunks), key=lambda s: s.split_id)


def _bounds(split: Any) -> str:
    lo = "-inf" if split.start is None else ", ".join(map(str, split.start))
    hi = "+inf" if split.end is None else ", ".join(map(str, split.end))
    return f"[{lo} .. {hi})"


def _wait_for_stream(
    store: StateStore, manifest: Manifest, at: BinlogOffset, timeout: float, progress: Callable[[str], None]
) -> BinlogOffset:
    """Block until the stream's checkpoint reaches ``at``; a :class:`VerifyError` as soon as the
    stream is not running (it never will), or after ``timeout`` while it runs behind."""
    deadline = time.monotonic() + timeout
    while True:
        reached = _stream_reaches(store, manifest, at)
        if reached is not None and reached >= at:
            return reached
        if time.monotonic() > deadline:
            known = stream_state(store)["run_id"] is not None  # else a stream run without a run record
            raise VerifyError(
                f"the stream{' runs but' if known else ''} has not applied the source up to {at} within "
                f"{timeout:.0f}s (its checkpoint is at {reached or 'nothing yet'}): "
                + ("it is behind. Look at its lag (mysqlcdc status)" if known else "is it running? Start it")
                + " and verify again, or raise the wait timeout"
            )
        progress(f"waiting for the stream to reach {at} (checkpoint at {reached or 'nothing yet'})")
        time.sleep(min(2.0, max(0.2, deadline - time.monotonic())))


def _stream_reaches(store: StateStore, manifest: Manifest, at: BinlogOffset) -> BinlogOffset | None:
    """The stream's checkpoint offset; a :class:`VerifyError` naming the fix if it is behind ``at`` and
    the stream is not running: the lake will not move."""
    reached = checkpoint_offset(store, manifest)
    if reached is not None and reached >= at:
        return reached
    state = stream_state(store)
    if state["run_id"] is None:  # no run record (a stream run without one): nothing to judge by, wait
        return reached
    _, not_running = watch_condition(state, None, None)
    if not_running is None:
        return reached
    reached = checkpoint_offset(store, manifest)  # it may have reached `at` just before it stopped
    if reached is not None and reached >= at:
        return reached
    raise VerifyError(
        f"cannot verify: the lake stops at {reached or 'the snapshot'} (the stream's checkpoint), behind the source's "
        f"{at}, and {not_running[0].lower()}{not_running[1:]}. Then verify again"
    )


def _kill_query(settings: ConnectionSettings, thread_id: int) -> None:
    """Stop the server's work on a connection's running statement (the source digests of a verify
    that gives up); best effort."""
    try:
        with settings.connect() as conn, conn.cursor() as cur:
            cur.execute(f"KILL QUERY {int(thread_id)}")
    except Exception as exc:  # the query may have ended; the digests then finish on their own
        log.debug("KILL QUERY %s: %s", thread_id, exc)


def _changed_keys(
    settings: ConnectionSettings, manifest: Manifest, names: list[str], start: BinlogOffset, end: BinlogOffset
) -> dict[str, set[tuple[Any, ...]]]:
    """Chunk-key tuples of every row image of ``names`` changed in ``(start, end]``."""
    moved: dict[str, set[tuple[Any, ...]]] = {t: set() for t in names}
    if not start < end:
        return moved
    keys = {t: manifest.tables[t].chunk_key_columns for t in names}
    server_id = settings.server_id_range[1]
    schemas = {t: manifest.tables[t].schema for t in names}
    optional = {t: manifest.tables[t].optional_columns for t in names}
    with BinlogRangeReader(settings, start, end, names, server_id, schemas=schemas, added_columns=optional) as reader:
        for change in reader:
            for image in (change.before, change.after):
                if image is not None:
                    moved[change.table].add(normal_key(image[k] for k in keys[change.table]))
    return moved


__all__ = ["VerifyError", "VerifyReport", "verify_pipeline"]
