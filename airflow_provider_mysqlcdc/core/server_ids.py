"""Which replication ``server_id`` each binlog reader of a pipeline uses: distinct by construction.

Two replicas with the same ``server_id`` kick each other off the source server, so every binlog
reader that runs at the same time as another needs its own id. The readers of one pipeline are the
stream's decoders (at most ``stream_readers`` tasks per micro-batch, one micro-batch at a time) and
the snapshot groups' binlog windows (one reader per group; a backfill's groups run while the
stream runs). The connection's ``server_id_range`` ``[lo, hi]`` is split into two disjoint blocks
(docs/architecture.md, "Replication server_ids"):

* the **stream block** ``[lo, lo + stream_readers)``: decoder slot ``i`` uses ``lo + i``
  (:class:`ServerIdSlots` hands the slots out; a slot is free again once its reader finished);
* the **snapshot block** ``[lo + stream_readers, hi]``: group ``g`` uses
  ``snapshot_lo + g mod snapshot_size``. The plan makes at most ``snapshot_size`` groups
  (:attr:`ServerIdLayout.max_groups`), so every group of a plan has its own id whatever order
  the mapped tasks run in (runs of one pipeline are serialised).

:meth:`ServerIdLayout.check` refuses a range too small for ``stream_readers`` plus
``max_parallel_groups`` (the mapped snapshot task's concurrency) with the numbers. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: How many snapshot groups may run at once (the example DAG's ``max_active_tis_per_dagrun``).
DEFAULT_MAX_PARALLEL_GROUPS = 16
#: Binlog decoders of the stream per micro-batch, when the pipeline does not say.
DEFAULT_STREAM_READERS = 8
MAX_SERVER_ID = 2**32 - 1


class ServerIdRangeError(ValueError):
    """The ``server_id_range`` cannot give every concurrent reader its own id; the message says how to fix it."""


def _check_range(id_range: tuple[int, int]) -> tuple[int, int]:
    lo, hi = int(id_range[0]), int(id_range[1])
    if not (1 <= lo <= hi <= MAX_SERVER_ID):
        raise ServerIdRangeError(f"server_id_range must satisfy 1 <= lo <= hi < 2^32, got {lo}-{hi}")
    return lo, hi


@dataclass(frozen=True)
class ServerIdLayout:
    """The split of ``id_range`` into the stream's block and the snapshot groups' block."""

    id_range: tuple[int, int]
    stream_readers: int = DEFAULT_STREAM_READERS

    def __post_init__(self) -> None:
        object.__setattr__(self, "id_range", _check_range(self.id_range))
        if self.stream_readers < 1:
            raise ServerIdRangeError(f"stream_readers must be >= 1, got {self.stream_readers}")

    @property
    def lo(self) -> int:
        return self.id_range[0]

    @property
    def hi(self) -> int:
        return self.id_range[1]

    @property
    def size(self) -> int:
        return self.hi - self.lo + 1

    @property
    def stream_block(self) -> range:
        return range(self.lo, min(self.lo + self.stream_readers, self.hi + 1))

    @property
    def snapshot_block(self) -> range:
        return range(self.lo + self.stream_readers, self.hi + 1)

    @property
    def max_groups(self) -> int:
        """The most groups one plan may have so that each has its own id (0 if the block is empty)."""
        return len(self.snapshot_block)

    def needed(self, max_parallel_groups: int) -> int:
        return self.stream_readers + max_parallel_groups

    def check(self, max_parallel_groups: int) -> None:
        """Refuse a range that cannot hold the stream's readers plus ``max_parallel_groups`` groups."""
        if max_parallel_groups < 1:
            raise ServerIdRangeError(f"max_parallel_groups must be >= 1, got {max_parallel_groups}")
        need = self.needed(max_parallel_groups)
        if self.size < need:
            raise ServerIdRangeError(
                f"server_id_range {self.lo}-{self.hi} has {self.size} ids; this pipeline needs "
                f"{self.stream_readers} (stream readers) + {max_parallel_groups} (parallel snapshot groups) = "
                f"{need}: widen it in the connection extra (e.g. {self.lo}-{self.lo + need - 1}) or lower "
                "stream_readers/max_parallel_groups"
            )

    def stream_id(self, slot: int) -> int:
        if not 0 <= slot < len(self.stream_block):
            raise ServerIdRangeError(f"stream reader slot {slot} is outside 0..{len(self.stream_block) - 1}")
        return self.lo + slot

    def group_id(self, group: int) -> int:
        """The id of snapshot group ``group``'s binlog window reader."""
        if group < 0:
            raise ValueError(f"group must be >= 0, got {group}")
        if not self.max_groups:
            raise ServerIdRangeError(
                f"server_id_range {self.lo}-{self.hi} has {self.size} ids, all taken by the {self.stream_readers} "
                f"stream readers: widen it in the connection extra (e.g. {self.lo}-{self.lo + self.stream_readers})"
            )
        return self.snapshot_block.start + group % self.max_groups


@dataclass
class ServerIdSlots:
    """The stream's decoder slots: ``acquire`` the lowest free one, ``release`` it once its reader finished.

    ``first`` is the stream block's first id, ``count`` its size (the stream's ``readers``). Never
    hands out an id that is held; asking for more than ``count`` at once is an error (the caller
    never plans more concurrent readers than ``count``).
    """

    first: int
    count: int
    _held: dict[int, object] = field(default_factory=dict, repr=False)  # slot -> owner

    def __post_init__(self) -> None:
        if self.count < 1 or self.first < 1 or self.first + self.count - 1 > MAX_SERVER_ID:
            raise ServerIdRangeError(f"stream server_ids {self.first}..{self.first + self.count - 1} are not valid")

    @property
    def held(self) -> int:
        return len(self._held)

    def acquire(self, owner: object) -> int:
        for slot in range(self.count):
            if slot not in self._held:
                self._held[slot] = owner
                return self.first + slot
        raise ServerIdRangeError(
            f"all {self.count} stream server_ids ({self.first}..{self.first + self.count - 1}) are held by running "
            "readers"
        )

    def release(self, owner: object) -> int:
        """Free every slot ``owner`` holds; returns how many."""
        mine = [s for s, o in self._held.items() if o == owner]
        for s in mine:
            del self._held[s]
        return len(mine)

    def release_all(self) -> None:
        self._held.clear()


__all__ = [
    "DEFAULT_MAX_PARALLEL_GROUPS",
    "DEFAULT_STREAM_READERS",
    "ServerIdLayout",
    "ServerIdRangeError",
    "ServerIdSlots",
]
