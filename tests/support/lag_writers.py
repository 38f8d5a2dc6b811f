"""Source writers and Delta version pollers for the lag benchmarks, each in a process of its own.

Why processes: a stream's driver shares its interpreter with nothing but the stream. A writer
issuing hundreds of statements a second, or a poller reloading the Delta log every 50 ms, run as
threads of the benchmark's process hold the same GIL the stream's apply threads need, and the lag
measured would include that contention, which no deployment has. Started with ``spawn`` (the
benchmark's process runs a JVM gateway and threads, which ``fork`` would copy half-way).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pymysql


class ProcessWriter:
    """Runs ``target(out_path=..., **kwargs)`` in a spawned process; after :meth:`join`,
    ``committed`` holds what it wrote to ``out_path`` (value -> commit wall time) and ``error``
    the child's failure, if any."""

    def __init__(self, target: Callable[..., None], **kwargs: Any):
        self.target, self.kwargs = target, kwargs
        fd, self.out_path = tempfile.mkstemp(prefix="lag-writer-", suffix=".json")
        os.close(fd)
        self.committed: dict[int, float] = {}
        self.error: str | None = None
        self._process: Any = None

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._process = ctx.Process(target=self.target, kwargs={"out_path": self.out_path, **self.kwargs}, daemon=True)
        self._process.start()

    def join(self) -> None:
        self._process.join()
        try:
            with open(self.out_path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            self.error = f"the writer process (exit code {self._process.exitcode}) left no result: {exc}"
            return
        finally:
            os.unlink(self.out_path)
        self.committed = {int(k): v for k, v in doc.get("committed", {}).items()}
        self.error = doc.get("error")


def _finish(out_path: str, committed: dict[int, float], error: BaseException | None) -> None:
    with open(out_path, "w") as f:
        json.dump({"committed": committed, "error": None if error is None else repr(error)}, f)


def _paced(out_path: str, socket: str, database: str | None, rate: float, seconds: float,
           write: Callable[[Any, Any, int], list[int]]) -> None:  # fmt: skip
    """Calls ``write(connection, cursor, rows written so far)``, which commits and returns the values
    it wrote, at ``rate`` rows/s until ``seconds`` pass or it returns none; records when each
    value's commit returned and leaves the result (or the failure) in ``out_path``."""
    committed: dict[int, float] = {}
    error: BaseException | None = None
    try:
        conn = pymysql.connect(unix_socket=socket, user="root", password="", database=database, autocommit=True,
                               charset="utf8mb4")  # fmt: skip
        with conn.cursor() as cur:
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                values = write(conn, cur, len(committed))
                if not values:
                    break
                done = time.time()  # the commit returned
                committed.update(dict.fromkeys(values, done))
                delay = t0 + len(committed) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        conn.close()
    except BaseException as exc:  # reported by the parent
        error = exc
    _finish(out_path, committed, error)


def update_random_tables(*, out_path: str, socket: str, tables: list[str], rows: int, rate: float, seconds: float,
                         first_value: int, seed: int) -> None:  # fmt: skip
    """``rate`` single-row UPDATE transactions/s, each on a random table and key, setting ``v`` to a
    new sequence number from ``first_value`` on; records when each commit returned."""
    rnd = random.Random(seed)

    def write(conn: Any, cur: Any, done: int) -> list[int]:
        seq = first_value + done
        cur.execute(f"UPDATE {rnd.choice(tables)} SET v = {seq} WHERE id = {rnd.randint(1, rows)}")
        return [seq]

    _paced(out_path, socket, None, rate, seconds, write)


def update_keys(*, out_path: str, socket: str, database: str, keys: list[int], rate: float, seconds: float,
                rows_per_tx: int, first_value: int) -> None:  # fmt: skip
    """``rate`` row UPDATEs/s of ``database.orders`` on ``keys`` in order, ``rows_per_tx`` per
    transaction, setting ``customer`` to a new sequence number; records when each commit returned."""
    n = max(1, rows_per_tx)

    def write(conn: Any, cur: Any, done: int) -> list[int]:
        batch = [(first_value + done + j, key) for j, key in enumerate(keys[done : done + n])]
        if n > 1:
            conn.begin()
        for seq, key in batch:
            cur.execute("UPDATE orders SET customer = %s, created = NOW(6) WHERE id = %s", (seq, key))
        if n > 1:
            conn.commit()
        return [seq for seq, _ in batch]

    _paced(out_path, socket, database, rate, seconds, write)


class ProcessPoller:
    """Records, in a spawned process, the wall time each version of a Delta table is first seen by
    a reader polling every ``interval`` seconds; ``seen`` and ``errors`` are filled by :meth:`stop`."""

    def __init__(self, uri: str, interval: float):
        self.uri, self.interval = uri, interval
        fd, self.out_path = tempfile.mkstemp(prefix="delta-poller-", suffix=".json")
        os.close(fd)
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._process = ctx.Process(target=poll_versions, args=(uri, interval, self._stop, self._ready, self.out_path),
                                    daemon=True)  # fmt: skip
        self.seen: dict[int, float] = {}
        self.errors: list[str] = []

    def start(self, timeout: float = 60.0) -> None:
        self._process.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the Delta poller did not start within {timeout:.0f} s")

    def stop(self) -> None:
        self._stop.set()
        self._process.join()
        with open(self.out_path) as f:
            doc = json.load(f)
        os.unlink(self.out_path)
        self.seen = {int(k): v for k, v in doc["seen"].items()}
        self.errors = doc["errors"]


def poll_versions(uri: str, interval: float, stop: Any, ready: Any, out_path: str) -> None:
    from deltalake import DeltaTable

    dt = DeltaTable(uri)
    seen: dict[int, float] = {dt.version(): time.time()}
    errors: list[str] = []
    ready.set()
    while not stop.is_set():
        t = time.time()
        try:
            dt.update_incremental()
        except Exception as exc:  # a log entry being written, say: read it again next poll
            errors.append(repr(exc)[:300])
            stop.wait(interval)
            continue
        v = dt.version()
        seen_at = time.time()  # a version found now was visible by now (not before it was committed)
        for missing in range(max(seen) + 1, v + 1):
            seen.setdefault(missing, seen_at)
        stop.wait(max(0.0, interval - (time.time() - t)))
    with open(out_path, "w") as f:
        json.dump({"seen": seen, "errors": errors[:50]}, f)


__all__ = ["ProcessPoller", "ProcessWriter", "poll_versions", "update_keys", "update_random_tables"]
