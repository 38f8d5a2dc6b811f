"""Pipeline parameters: what a DAG run (or the CLI) asks for, validated before anything runs.

The example DAG's Params are validated by JSON schema in the trigger form; this module checks the
same things again — and the things a schema cannot say (``resnapshot_tables`` must be among
``tables``, a specific offset needs a file and a position) — because operators are also used with
templated values, from other DAGs and from the CLI. Every problem is reported at once, each with
the value that was given and what to give instead. Pure: no Airflow, no connections.

``backfill_tables`` is the old name of ``resnapshot_tables`` (it collided with Airflow's own
"backfill" of date ranges): still accepted, with a deprecation note in :attr:`PipelineConfig.notes`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_mysqlcdc.core.chunk import DEFAULT_CHUNK_SIZE
from airflow_provider_mysqlcdc.core.gtid import GtidSet, GtidSetError
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.core.param_values import (
    bool_value,
    given_value,
    int_value,
    norm_table,
    offset_text,
    repair_chunks_value,
    snapshot_filters_value,
    table_list,
    timestamp_value,
)
from airflow_provider_mysqlcdc.core.routing import Routes
from airflow_provider_mysqlcdc.core.server_ids import DEFAULT_MAX_PARALLEL_GROUPS, DEFAULT_STREAM_READERS
from airflow_provider_mysqlcdc.core.table_selection import TablePattern, TableSelection

STARTUP_MODES = ("initial", "latest-offset", "specific-offset", "snapshot-only", "earliest-offset", "timestamp")
#: Modes that start new tables at an offset other than "now": the stream's checkpoint must not be past it.
RESOLVED_START_MODES = ("specific-offset", "earliest-offset", "timestamp")
#: Below this chunk size, or above MAX_CHUNKS_PER_TABLE chunks for one table, a plan is refused
#: unless allow_large_plan is set: each chunk costs a query and bookkeeping, each group a Spark
#: application, so such a plan is almost always a typo (chunk_size 1) and takes hours.
MIN_CHUNK_SIZE = 100
MAX_CHUNKS_PER_TABLE = 10_000
STREAM_MODES = ("detached", "attached")
DEFAULT_CHUNKS_PER_TASK = 64

_BINLOG_FILE = re.compile(r"^[^/\s]+\.\d+$")


_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_pipeline_id(pipeline_id: str) -> str:
    """A pipeline id names a directory in the state store and a Delta table's owner: keep it plain."""
    if not isinstance(pipeline_id, str) or not _SAFE_ID.match(pipeline_id):
        raise ValueError(
            f"pipeline_id {pipeline_id!r} is not valid: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )
    return pipeline_id


class PipelineConfigError(ValueError):
    """Bad pipeline parameters; the message lists every problem and the fix for each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid pipeline parameters:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True)
class PipelineConfig:
    pipeline_id: str
    sink_root: str
    state_root: str
    tables: list[str]  # exact names and patterns (core/table_selection.py); the plan resolves them
    chunk_size: int = DEFAULT_CHUNK_SIZE
    chunks_per_task: int = DEFAULT_CHUNKS_PER_TASK
    startup_mode: str = "initial"
    specific_offset: dict[str, Any] | None = None
    resnapshot_tables: list[str] = field(default_factory=list)
    skip_backfill: bool = False
    chunk_key_columns: dict[str, list[str]] = field(default_factory=dict)
    takeover_tables: list[str] = field(default_factory=list)
    allow_large_plan: bool = False
    # server_id budget (core/server_ids.py): the stream's decoders, and how many snapshot groups
    # (mapped tasks) run at once; the plan refuses a server_id_range too small for both.
    stream_readers: int = DEFAULT_STREAM_READERS
    max_parallel_groups: int = DEFAULT_MAX_PARALLEL_GROUPS
    exclude_tables: list[str] = field(default_factory=list)
    startup_timestamp: float | None = None  # epoch seconds, for startup_mode "timestamp"
    repair_chunks: dict[str, list[int]] = field(default_factory=dict)  # table -> chunk ids (verify's output)
    recover_purged: bool = False  # restart at the current offset and re-snapshot everything if the binlog is gone
    # table -> SQL condition: refresh only the rows of a captured table it selects (a partial backfill)
    snapshot_filters: dict[str, str] = field(default_factory=dict)
    max_rows_per_second: int | None = None  # the snapshot's read rate over all its tasks; None = unlimited
    changelog_tables: list[str] = field(default_factory=list)  # names/patterns whose changes are also logged
    metadata_columns: bool = False  # mirror rows carry _op, _commit_ts, _binlog_file, _binlog_pos
    routes: list[dict[str, str]] = field(default_factory=list)  # [{source: pattern, target: db.table}]
    notes: list[str] = field(default_factory=list)  # warnings worth a log line (deprecated names)

    @property
    def selection(self) -> TableSelection:
        return TableSelection.parse(self.tables, self.exclude_tables)

    def has_changelog(self, table: str) -> bool:
        """Whether ``table`` (a captured one) gets a changelog table (docs/architecture.md, "Changelog")."""
        return bool(self.changelog_tables) and TableSelection.parse(self.changelog_tables).selects(table)

    @property
    def routing(self) -> Routes:
        """The routes of sharded tables into shared Delta tables (core/routing.py)."""
        return Routes.from_list(self.routes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def snapshots(self) -> bool:
        """Whether new tables are snapshotted (else they start at an offset with no existing rows)."""
        return self.startup_mode in ("initial", "snapshot-only")

    @property
    def streams(self) -> bool:
        return self.startup_mode != "snapshot-only"

    def start_offset(self) -> BinlogOffset | None:
        """The ``specific-offset`` given as file:pos (None when it is a GTID set: see
        :attr:`start_gtid_set`, placed on the server by the plan)."""
        if self.startup_mode != "specific-offset" or not self.specific_offset or self.start_gtid_set:
            return None
        return BinlogOffset(str(self.specific_offset["file"]), int(self.specific_offset["pos"]))

    @property
    def start_gtid_set(self) -> str | None:
        """The ``specific-offset`` given as a GTID set (Flink CDC's ``specific-offset.gtid-set``)."""
        if self.startup_mode != "specific-offset" or not self.specific_offset:
            return None
        return self.specific_offset.get("gtid_set") or None

    @classmethod
    def from_params(cls, **params: Any) -> PipelineConfig:
        """Validate and normalise; raise :class:`PipelineConfigError` listing every problem."""
        problems: list[str] = []
        pipeline_id = params.get("pipeline_id")
        try:
            check_pipeline_id(pipeline_id)  # type: ignore[arg-type]
        except ValueError as exc:
            problems.append(str(exc))
        roots = {}
        for name in ("sink_root", "state_root"):
            v = params.get(name)
            if not isinstance(v, str) or not v.strip():
                problems.append(f"{name} must be a directory or URL (e.g. /data/lake or s3://bucket/lake), got {v!r}")
            roots[name] = (v or "").strip() if isinstance(v, str) else ""

        tables = table_list("tables", params.get("tables"), problems, patterns=True)
        if not tables and not any(p.startswith("tables") for p in problems):
            problems.append("tables is empty: list at least one <database>.<table> or pattern, e.g. "
                            "[\"shop.orders\"] or [\"shop.*\"]")  # fmt: skip
        exclude = table_list("exclude_tables", params.get("exclude_tables") or [], problems, patterns=True)
        selection = TableSelection.parse(tables, exclude) if tables and not any(
            p.startswith(("tables", "exclude_tables")) for p in problems) else None  # fmt: skip
        notes: list[str] = []
        resnapshot = table_list("resnapshot_tables", params.get("resnapshot_tables") or [], problems)
        legacy = table_list("backfill_tables", params.get("backfill_tables") or [], problems)
        if legacy:
            notes.append(
                f"backfill_tables is deprecated (it collides with Airflow's own backfill of date ranges): use "
                f"resnapshot_tables={legacy} instead"
            )
            resnapshot += [t for t in legacy if t not in resnapshot]
        unknown = [t for t in resnapshot if selection is None or not selection.selects(t)]
        if unknown:
            problems.append(
                f"resnapshot_tables {unknown} are not in tables {tables}"
                + (f" minus exclude_tables {exclude}" if exclude else "")
                + ": a table is re-snapshotted only if it is captured; add it to tables as well"
            )
        takeover = table_list("takeover_tables", params.get("takeover_tables") or [], problems)
        unknown = [t for t in takeover if selection is None or not selection.selects(t)]
        if unknown:
            problems.append(
                f"takeover_tables {unknown} are not in tables {tables} (no entry selects them): add them to tables"
            )
        allow_large = bool_value("allow_large_plan", params.get("allow_large_plan", False), problems)
        repair = repair_chunks_value(params.get("repair_chunks"), problems)
        recover = bool_value("recover_purged", params.get("recover_purged", False), problems)
        unknown = [t for t in repair if selection is None or not selection.selects(t)]
        if unknown:
            problems.append(f"repair_chunks names {unknown}, which are not in tables {tables}: add them to tables")
        both = sorted(set(repair) & set(resnapshot))
        if both:
            problems.append(f"{both} are in both resnapshot_tables and repair_chunks: a re-snapshot already "
                            "replaces every chunk; give each table to one of them")  # fmt: skip
        filters = snapshot_filters_value(params.get("snapshot_filters"), problems)
        unknown = [t for t in filters if selection is None or not selection.selects(t)]
        if unknown:
            problems.append(f"snapshot_filters names {unknown}, which are not in tables {tables}: add them to tables")
        both = sorted(set(filters) & set(resnapshot))
        if both:
            problems.append(f"{both} are in both resnapshot_tables and snapshot_filters: a re-snapshot replaces "
                            "every row, a filter refreshes only the rows it selects; give each table to one of "
                            "them")  # fmt: skip
        changelog = table_list("changelog_tables", params.get("changelog_tables") or [], problems, patterns=True)
        named = TableSelection.parse(changelog).exact_names if changelog else []
        exact = [t for t in named if selection is not None and not selection.selects(t)]
        if exact:
            problems.append(f"changelog_tables names {exact}, which are not in tables {tables}: add them to tables")
        metadata = bool_value("metadata_columns", params.get("metadata_columns", False), problems)
        routes = Routes.parse(params.get("routes"), problems)
        stray = [r.source for r in routes.rules if TablePattern.parse(r.source).kind == "exact"
                 and selection is not None and not selection.selects(r.source)]  # fmt: skip
        if stray:
            problems.append(f"routes name {stray}, which are not in tables {tables}: a route applies to captured "
                            "tables only; add them (or a pattern selecting them) to tables")  # fmt: skip
        rate = given_value(params, "max_rows_per_second", None)
        rate = None if rate is None or rate == 0 or rate == "0" else int_value("max_rows_per_second", rate, 1, None,
                                                                        problems)  # fmt: skip

        chunk_size = int_value("chunk_size", params.get("chunk_size", DEFAULT_CHUNK_SIZE), 1, None, problems)
        if chunk_size is not None and chunk_size < MIN_CHUNK_SIZE and not allow_large:
            problems.append(
                f"chunk_size {chunk_size} is below {MIN_CHUNK_SIZE} rows: every chunk costs a query and its "
                f"bookkeeping, so a 1M-row table would make {1_000_000 // chunk_size:,} chunks. Use a chunk_size of "
                f"{MIN_CHUNK_SIZE} or more (the default is {DEFAULT_CHUNK_SIZE}), or set allow_large_plan=true if "
                "you mean it"
            )
        chunks_per_task = int_value(
            "chunks_per_task", params.get("chunks_per_task", DEFAULT_CHUNKS_PER_TASK), 1, 100_000, problems
        )
        stream_readers = int_value("stream_readers", given_value(params, "stream_readers", DEFAULT_STREAM_READERS),
                                   1, 1024, problems)  # fmt: skip
        max_parallel_groups = int_value("max_parallel_groups",
                                   given_value(params, "max_parallel_groups", DEFAULT_MAX_PARALLEL_GROUPS), 1, 1024,
                                   problems)  # fmt: skip
        mode = params.get("startup_mode") or "initial"
        if mode not in STARTUP_MODES:
            problems.append(f"startup_mode {mode!r} is not one of {list(STARTUP_MODES)}")
        if (resnapshot or repair or recover) and mode not in ("initial", "snapshot-only"):
            what = ("resnapshot_tables" if resnapshot else "repair_chunks" if repair else "recover_purged") + " needs"
            problems.append(
                f"{what} startup_mode 'initial' or 'snapshot-only' (a re-snapshot is a snapshot), "
                f"got {mode!r}"
            )
        offset = params.get("specific_offset") or None
        if isinstance(offset, str) and offset.strip():
            offset = offset_text(offset, problems)
        if mode == "specific-offset":
            offset = _specific_offset(offset, problems)
        else:
            offset = None
        startup_ts = timestamp_value(params.get("startup_timestamp"), problems)
        if mode == "timestamp" and startup_ts is None and not any(p.startswith("startup_timestamp") for p in problems):
            problems.append(
                "startup_mode 'timestamp' needs startup_timestamp: an ISO 8601 time such as "
                "2026-11-24T10:00:00Z (no zone = UTC) or epoch seconds; new tables start at the first transaction "
                "at or after it"
            )
        skip_backfill = bool_value("skip_backfill", params.get("skip_backfill", False), problems)
        ck = params.get("chunk_key_columns") or {}
        if isinstance(ck, str):
            try:
                ck = json.loads(ck) if ck.strip() else {}
            except json.JSONDecodeError:
                problems.append(f"chunk_key_columns must be a JSON object like {{\"db.t\": [\"col\"]}}, got {ck!r}")
                ck = {}
        if not isinstance(ck, dict) or not all(
            isinstance(v, list) and v and all(isinstance(c, str) for c in v) for v in ck.values()
        ):
            problems.append(f"chunk_key_columns must map <database>.<table> to a list of column names, got {ck!r}")
            ck = {}
        if problems:
            raise PipelineConfigError(problems)
        return cls(
            pipeline_id=str(pipeline_id),
            sink_root=roots["sink_root"],
            state_root=roots["state_root"],
            tables=tables,
            chunk_size=int(chunk_size),  # type: ignore[arg-type]
            chunks_per_task=int(chunks_per_task),  # type: ignore[arg-type]
            startup_mode=str(mode),
            specific_offset=offset,
            resnapshot_tables=resnapshot,
            skip_backfill=bool(skip_backfill),
            chunk_key_columns={norm_table(k): list(v) for k, v in ck.items()},
            takeover_tables=takeover,
            allow_large_plan=bool(allow_large),
            stream_readers=int(stream_readers),  # type: ignore[arg-type]
            max_parallel_groups=int(max_parallel_groups),  # type: ignore[arg-type]
            exclude_tables=exclude,
            startup_timestamp=startup_ts if mode == "timestamp" else None,
            repair_chunks=repair,
            recover_purged=bool(recover),
            snapshot_filters=filters,
            max_rows_per_second=rate,
            changelog_tables=changelog,
            metadata_columns=metadata,
            routes=routes.to_list(),
            notes=notes,
        )


def _specific_offset(offset: Any, problems: list[str]) -> dict[str, Any] | None:
    """``{"gtid_set": ...}`` or ``{"file": ..., "pos": ...}``, each checked; None with a problem."""
    gtid = str(offset.get("gtid_set") or "").strip() if isinstance(offset, dict) else ""
    if gtid and gtid != "None":
        try:
            GtidSet.parse(gtid)
        except GtidSetError as exc:
            problems.append(f"specific_offset gtid_set: {exc}; give MySQL's uuid:1-100 or MariaDB's 0-1-100 form "
                            "(SELECT @@gtid_executed / @@gtid_binlog_pos)")  # fmt: skip
            return None
        return {"gtid_set": gtid}
    if not isinstance(offset, dict) or not offset.get("file") or offset.get("pos") in (None, "", "None"):
        problems.append(
            "startup_mode 'specific-offset' needs specific_offset: a GTID set (specific_offset_gtid_set, e.g. "
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100 on MySQL, 0-1-100 on MariaDB: it survives a failover) or a "
            "binlog file and position, e.g. {\"file\": \"mysql-bin.000042\", \"pos\": 4} (take them from SHOW "
            "MASTER STATUS)"
        )
        return None
    if not _BINLOG_FILE.match(str(offset["file"])):
        problems.append(f"specific_offset file {offset['file']!r} is not a binlog file name like mysql-bin.000042")
    pos = int_value("specific_offset pos", offset["pos"], 4, None, problems)
    return {"file": str(offset["file"]), "pos": pos}
