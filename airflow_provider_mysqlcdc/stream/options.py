"""How a stream reads and applies: the options the job, the applier and the benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_provider_mysqlcdc.core.schema_policy import DEFAULT_SCHEMA_CHANGE_POLICY, check_policy
from airflow_provider_mysqlcdc.sinks.delta_maintenance import MaintenancePolicy

#: The default of ``small_table_retention_seconds``: the grace of a reader of a small table's older version.
DEFAULT_SMALL_TABLE_RETENTION_SECONDS = 120.0


def check_small_tables(rewrite_below_mb: object, retention_seconds: object, vacuum_retention_hours: object = 1.0,
                       apply_memory_mb: object = 512) -> None:  # fmt: skip
    """Refuse small-table settings that cannot work, naming the setting and the fix (the stream
    operator calls this before it launches anything; ``StreamOptions`` again in the job)."""
    if isinstance(rewrite_below_mb, bool) or not isinstance(rewrite_below_mb, int) or rewrite_below_mb < 0:
        raise ValueError(f"rewrite_below_mb must be a whole number of MiB, 0 (never rewrite a table whole) or more, "
                         f"got {rewrite_below_mb!r}")  # fmt: skip
    if isinstance(apply_memory_mb, (int, float)) and rewrite_below_mb > apply_memory_mb:
        raise ValueError(f"rewrite_below_mb={rewrite_below_mb} exceeds apply_memory_mb={apply_memory_mb}: a table "
                         "rewritten whole is held in the driver's memory; lower rewrite_below_mb or raise "
                         "apply_memory_mb")  # fmt: skip
    if retention_seconds is None:  # the default: never above the vacuum retention
        return
    if isinstance(retention_seconds, bool) or not isinstance(retention_seconds, (int, float)) or retention_seconds < 1:
        raise ValueError(f"small_table_retention_seconds must be a number of seconds, at least 1 (the time a "
                         "reader of an older version of a small table has to read it), got "
                         f"{retention_seconds!r}")  # fmt: skip
    if isinstance(vacuum_retention_hours, (int, float)) and retention_seconds > vacuum_retention_hours * 3600:
        raise ValueError(f"small_table_retention_seconds={retention_seconds:g} exceeds vacuum_retention_hours="
                         f"{vacuum_retention_hours:g} ({vacuum_retention_hours * 3600:g} s): a small table keeps at "
                         "most what every table keeps; lower small_table_retention_seconds or raise "
                         "vacuum_retention_hours")  # fmt: skip


@dataclass
class StreamOptions:
    """How the stream reads and applies; README "Large transactions" documents the memory ones."""

    trigger_seconds: float = 1.0
    max_events_per_trigger: int | None = 200_000  # binlog EVENTS (a rows event holds many rows)
    # Binlog bytes per micro-batch: bounds what a batch brings to the driver (the fold and MERGE run
    # there). Without it, 1,000-row transactions make 200k events ~5M rows: an OOM on a 1g driver.
    # A single transaction above the cap still forms one batch: see max_inline_bytes.
    max_bytes_per_trigger: int | None = 32 * 1024 * 1024
    readers: int | None = None  # parallel binlog decoders per micro-batch; None = Spark's cores
    # Change blocks per micro-batch sent through Spark to the driver (shared by its tasks); the rest
    # is staged in the state store (stream/staged_blocks.py). None = the source's default (32 MiB).
    max_inline_bytes: int | None = None
    # Memory the driver's Python may use to fold and match ONE table's changes of a batch; a batch
    # whose blocks need more is folded in hash buckets spilled to scratch_dir (spill/bucketed_fold.py)
    # and applied by a bounded copy-on-write rewrite in one commit (sinks/delta_rewrite.py).
    apply_memory_mb: int = 512
    scratch_dir: str | None = None  # local scratch space of the driver; None = the system temp dir
    # Tables of one micro-batch applied at once (each table's changes by one thread, in order; each
    # table's commit carries the batch id as before). delta-rs releases the GIL while it writes, so a
    # batch touching many tables overlaps their commits. Only when the in-memory tables' folds fit
    # apply_memory_mb together; otherwise they go one by one.
    apply_threads: int = 4
    # Processes applying a batch's tables, each owning a fixed share of them and their carried state
    # (stream/apply_processes.py): threads overlap file I/O but share one GIL, processes use the
    # driver's cores. None = automatic: one per core (at most 4) for a stream of 64 tables or more on
    # a driver with 2+ cores, else 0; 0 = the driver's own threads (apply_threads) only.
    apply_processes: int | None = None
    # Tables whose Delta data files total at most this many MiB take a batch by rewriting the whole
    # table as one file from the rows the stream carries (sinks/delta_small_table.py) instead of a
    # delta-rs MERGE, whose query planning is most of a small table's apply time. The rewrite's cost
    # grows with the table (~12 ms per MiB here), a batch by deletion vectors costs ~15-45 ms however
    # big the table: larger tables take those, or the MERGE (bench/RESULTS.md). 0 = never rewrite.
    rewrite_below_mb: int = 2
    # How long a small table keeps its history: the files its batches supersede are deleted this many
    # seconds after (a reader holding an older version has this long to read it), its log entries go
    # after it too, and it is rewritten whole at most once per this time — the batches in between mark
    # changed rows with deletion vectors (sinks/delta_small_marks.py). Disk then stays a small multiple
    # of the live data whatever the churn (docs/architecture.md, "Committing small tables": Disk).
    # None: DEFAULT_SMALL_TABLE_RETENTION_SECONDS, or the vacuum retention if that is shorter.
    small_table_retention_seconds: float | None = None
    # Bigger tables with one integer key take a batch by marking the changed rows deleted with Delta
    # deletion vectors and writing only the changed rows (sinks/delta_dv_table.py), instead of a MERGE
    # that rewrites every file holding a changed key (the whole table, for spread-out updates). Readers
    # need deletion-vector support (Delta reader version 3: delta-rs' engine, Spark with Delta 2.3+).
    deletion_vectors: bool = True
    # What the stream does with a DDL of a captured table (core/schema_policy.py): evolve, lenient, fail.
    schema_change_policy: str = DEFAULT_SCHEMA_CHANGE_POLICY
    # Table maintenance between batches (sinks/delta_maintenance.py): compaction, checkpoint, vacuum.
    maintenance: MaintenancePolicy = field(default_factory=MaintenancePolicy)
    # Environment variables holding the source connection and the lake's storage options. A job
    # started by spark-submit has them (hooks/spark_submit.py); the binlog source then reads them
    # itself, so no secret is ever a source option (options show in query plans and event logs).
    # None: passed as options (a stream run inside a test or a notebook).
    source_env: str | None = None
    storage_env: str | None = None

    def __post_init__(self) -> None:
        if self.apply_memory_mb < 16:
            raise ValueError(f"apply_memory_mb must be at least 16, got {self.apply_memory_mb}")
        check_small_tables(self.rewrite_below_mb, self.small_table_retention_seconds,
                           self.maintenance.retention_hours, self.apply_memory_mb)  # fmt: skip
        if self.apply_threads < 1:
            raise ValueError(f"apply_threads must be at least 1, got {self.apply_threads}")
        if self.apply_processes is not None and self.apply_processes < 0:
            raise ValueError(f"apply_processes must be 0 (the driver's threads) or more, got {self.apply_processes}")
        if self.trigger_seconds < 0:
            raise ValueError(f"trigger_seconds must be 0 (batches back to back) or more, got {self.trigger_seconds}")
        check_policy(self.schema_change_policy)

    def small_table_retention(self) -> float:
        """``small_table_retention_seconds``, its default resolved (never above the vacuum retention)."""
        if self.small_table_retention_seconds is not None:
            return float(self.small_table_retention_seconds)
        return min(DEFAULT_SMALL_TABLE_RETENTION_SECONDS, max(1.0, self.maintenance.retention_hours * 3600))

    def source_options(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.source_env:
            out["source_env"] = self.source_env
        if self.storage_env:
            out["storage_env"] = self.storage_env
        if self.max_events_per_trigger:
            out["max_events_per_trigger"] = str(self.max_events_per_trigger)
        if self.max_bytes_per_trigger:
            out["max_bytes_per_trigger"] = str(self.max_bytes_per_trigger)
        if self.readers:
            out["readers"] = str(self.readers)
        if self.max_inline_bytes is not None:
            out["max_inline_bytes"] = str(self.max_inline_bytes)
        return out
