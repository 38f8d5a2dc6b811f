"""The snapshot's read throttle (``max_rows_per_second``): how the rate is shared and paced.

Why pacing per chunk and not per row: every chunk is read by one Spark task in one query, and a
query the client stops reading holds the server's thread until ``net_write_timeout`` ends it. So
a task reads its chunk at full speed and then waits until the chunk's rows fit its share of the
rate: the source sees short reads with pauses between them, and the rows per second over the
snapshot stay at or below the limit. Smaller chunks give a smoother load (docs/architecture.md,
"Snapshot throttle").
"""

from __future__ import annotations


def read_slot_rate(max_rows_per_second: float, groups_at_once: int, read_slots: int) -> float:
    """One read slot's share of the limit: the limit is shared by the snapshot groups that may run
    at once (``max_parallel_groups``, at most the plan's groups) and, inside a group, by the Spark
    tasks that read at once (its chunks, at most the cores)."""
    if max_rows_per_second <= 0:
        raise ValueError(f"max_rows_per_second must be positive, got {max_rows_per_second}")
    return max_rows_per_second / max(1, groups_at_once) / max(1, read_slots)


def pause_after_read(rows: int, elapsed_seconds: float, slot_rate: float | None) -> float:
    """Seconds a task waits after reading ``rows`` in ``elapsed_seconds`` so that it read at no
    more than ``slot_rate`` rows per second (0 when unthrottled or already slower)."""
    if not slot_rate or rows <= 0:
        return 0.0
    return max(0.0, rows / slot_rate - elapsed_seconds)


__all__ = ["pause_after_read", "read_slot_rate"]
