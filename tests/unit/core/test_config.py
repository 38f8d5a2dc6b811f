"""PipelineConfig: every bad parameter is reported at once, with the value given and the fix."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig, PipelineConfigError

BASE = {"pipeline_id": "shop", "sink_root": "/lake", "state_root": "/state", "tables": ["shop.orders"]}


def test_defaults_and_normalisation() -> None:
    c = PipelineConfig.from_params(**{**BASE, "tables": ["shop.orders", "`shop`.`items`", "shop.orders"]})
    assert c.tables == ["shop.orders", "shop.items"]
    assert c.startup_mode == "initial" and c.snapshots and c.streams
    assert c.resnapshot_tables == [] and c.skip_backfill is False and c.start_offset() is None
    assert c.takeover_tables == [] and c.allow_large_plan is False and c.notes == []


def test_templated_text_values_are_accepted() -> None:
    c = PipelineConfig.from_params(
        **{**BASE, "tables": "['shop.a', 'shop.b']", "chunk_size": "500", "chunks_per_task": "3",
           "resnapshot_tables": "shop.a", "skip_backfill": "True", "allow_large_plan": "false"}
    )
    assert c.tables == ["shop.a", "shop.b"] and c.chunk_size == 500 and c.chunks_per_task == 3
    assert c.resnapshot_tables == ["shop.a"] and c.skip_backfill is True and c.allow_large_plan is False


def test_backfill_tables_is_the_deprecated_name_of_resnapshot_tables() -> None:
    c = PipelineConfig.from_params(**{**BASE, "tables": ["shop.a", "shop.b"], "backfill_tables": ["shop.a"],
                                      "resnapshot_tables": ["shop.b"]})  # fmt: skip
    assert c.resnapshot_tables == ["shop.b", "shop.a"]
    assert len(c.notes) == 1 and "deprecated" in c.notes[0] and "resnapshot_tables=['shop.a']" in c.notes[0]


def test_small_chunks_need_allow_large_plan() -> None:
    with pytest.raises(PipelineConfigError, match=r"chunk_size 99 is below 100 rows.*allow_large_plan=true"):
        PipelineConfig.from_params(**{**BASE, "chunk_size": 99})
    assert PipelineConfig.from_params(**{**BASE, "chunk_size": 99, "allow_large_plan": True}).chunk_size == 99
    with pytest.raises(PipelineConfigError, match=r"takeover_tables \[.shop.x.\] are not in tables"):
        PipelineConfig.from_params(**{**BASE, "takeover_tables": ["shop.x"]})


def test_all_problems_reported_together() -> None:
    with pytest.raises(PipelineConfigError) as exc:
        PipelineConfig.from_params(
            pipeline_id="no spaces", sink_root="", state_root="/s", tables=["orders"], chunk_size=0,
            chunks_per_task=True, startup_mode="sometimes", resnapshot_tables=["shop.x"],
        )
    msg = str(exc.value)
    for fragment in (
        "pipeline_id 'no spaces' is not valid",
        "sink_root must be a directory or URL",
        "'orders' is not a table name written as <database>.<table>",
        "chunk_size must be >= 1, got 0",
        "chunks_per_task must be an integer, got True",
        "startup_mode 'sometimes' is not one of",
        "resnapshot_tables ['shop.x'] are not in tables",
    ):
        assert fragment in msg, msg
    assert len(exc.value.problems) >= 7


def test_empty_tables() -> None:
    with pytest.raises(PipelineConfigError, match="tables is empty"):
        PipelineConfig.from_params(**{**BASE, "tables": []})


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        ({"file": "mysql-bin.000042", "pos": 4}, ("mysql-bin.000042", 4)),
        ("mysql-bin.000007:1234", ("mysql-bin.000007", 1234)),
        ('{"file": "m.000001", "pos": "99"}', ("m.000001", 99)),
    ],
)
def test_specific_offset_forms(offset: object, expected: tuple[str, int]) -> None:
    c = PipelineConfig.from_params(**{**BASE, "startup_mode": "specific-offset", "specific_offset": offset})
    off = c.start_offset()
    assert off is not None and (off.file, off.pos) == expected
    assert not c.snapshots and c.streams


@pytest.mark.parametrize(
    ("offset", "fragment"),
    [
        (None, "needs specific_offset: a GTID set .* or a binlog file and position"),
        ({"gtid_set": "3e11fa47-71ca-11e1-9e33-c80aa9429562:x-y"}, "specific_offset gtid_set: not a MySQL GTID set"),
        ({"file": None, "pos": None}, "needs specific_offset"),
        ({"file": "notabinlog", "pos": 4}, "is not a binlog file name"),
        ({"file": "mysql-bin.000001", "pos": 2}, "specific_offset pos must be >= 4"),
        ("garbage", "neither"),
    ],
)
def test_specific_offset_problems(offset: object, fragment: str) -> None:
    with pytest.raises(PipelineConfigError, match=fragment):
        PipelineConfig.from_params(**{**BASE, "startup_mode": "specific-offset", "specific_offset": offset})


@pytest.mark.parametrize(
    "offset",
    [
        {"file": None, "pos": None, "gtid_set": "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100"},
        "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100",
        "0-1-100,1-2-5",
    ],
)
def test_specific_offset_as_a_gtid_set(offset: object) -> None:
    c = PipelineConfig.from_params(**{**BASE, "startup_mode": "specific-offset", "specific_offset": offset})
    assert c.start_gtid_set and c.start_offset() is None
    assert c.start_gtid_set == (offset["gtid_set"] if isinstance(offset, dict) else offset)


def test_offset_ignored_unless_specific_mode() -> None:
    c = PipelineConfig.from_params(**{**BASE, "specific_offset": {"file": None, "pos": None}})
    assert c.specific_offset is None


def test_resnapshot_needs_a_snapshot_mode() -> None:
    with pytest.raises(PipelineConfigError, match="resnapshot_tables needs startup_mode 'initial' or 'snapshot-only'"):
        PipelineConfig.from_params(**{**BASE, "startup_mode": "latest-offset", "resnapshot_tables": ["shop.orders"]})


def test_chunk_key_columns() -> None:
    c = PipelineConfig.from_params(**{**BASE, "chunk_key_columns": '{"shop.orders": ["id"]}'})
    assert c.chunk_key_columns == {"shop.orders": ["id"]}
    with pytest.raises(PipelineConfigError, match="chunk_key_columns must map"):
        PipelineConfig.from_params(**{**BASE, "chunk_key_columns": {"shop.orders": "id"}})


def test_server_id_budget_params() -> None:
    c = PipelineConfig.from_params(**BASE)
    assert (c.stream_readers, c.max_parallel_groups) == (8, 16)
    c = PipelineConfig.from_params(**{**BASE, "stream_readers": "6", "max_parallel_groups": 2})
    assert (c.stream_readers, c.max_parallel_groups) == (6, 2) and c.to_dict()["stream_readers"] == 6
    with pytest.raises(PipelineConfigError, match="max_parallel_groups must be between 1 and 1024, got 0"):
        PipelineConfig.from_params(**{**BASE, "max_parallel_groups": 0})


@pytest.mark.parametrize(("given", "epoch"), [
    ("2026-11-24T10:00:00Z", 1795514400.0), ("2026-11-24T10:00:00", 1795514400.0),
    ("2026-11-24T11:00:00+01:00", 1795514400.0), ("1795514400", 1795514400.0), (1795514400, 1795514400.0),
])  # fmt: skip
def test_startup_timestamp_forms(given: object, epoch: float) -> None:
    cfg = PipelineConfig.from_params(**BASE, startup_mode="timestamp", startup_timestamp=given)
    assert cfg.startup_timestamp == epoch
    earliest = PipelineConfig.from_params(**BASE, startup_mode="earliest-offset", startup_timestamp=given)
    assert earliest.startup_timestamp is None  # only the timestamp mode keeps it


def test_repair_chunks_take_verify_output_and_name_every_problem() -> None:
    cfg = PipelineConfig.from_params(**BASE, repair_chunks='{"shop.orders": [7, 3, 3]}')
    assert cfg.repair_chunks == {"shop.orders": [3, 7]}
    with pytest.raises(PipelineConfigError) as exc:
        PipelineConfig.from_params(**BASE, repair_chunks={"shop.other": [1], "shop.orders": [-1]},
                                   resnapshot_tables=["shop.orders"])  # fmt: skip
    msg = str(exc.value)
    assert "repair_chunks['shop.orders'] must be a non-empty list of chunk numbers" in msg
    assert "repair_chunks names ['shop.other'], which are not in tables" in msg
    with pytest.raises(PipelineConfigError, match=r"in both resnapshot_tables and repair_chunks"):
        PipelineConfig.from_params(**BASE, repair_chunks={"shop.orders": [1]}, resnapshot_tables=["shop.orders"])
    with pytest.raises(PipelineConfigError, match=r"repair_chunks needs startup_mode 'initial'"):
        PipelineConfig.from_params(**BASE, repair_chunks={"shop.orders": [1]}, startup_mode="latest-offset")
    with pytest.raises(PipelineConfigError, match=r"repair_chunks must be a JSON object"):
        PipelineConfig.from_params(**BASE, repair_chunks="{oops")


def test_snapshot_filters_and_the_throttle() -> None:
    c = PipelineConfig.from_params(**{**BASE, "snapshot_filters": '{"`shop`.`orders`": " status = \'late;\' "}',
                                      "max_rows_per_second": "5000"})  # fmt: skip
    assert c.snapshot_filters == {"shop.orders": "status = 'late;'"} and c.max_rows_per_second == 5000
    assert PipelineConfig.from_params(**{**BASE, "max_rows_per_second": 0}).max_rows_per_second is None
    with pytest.raises(PipelineConfigError) as err:
        PipelineConfig.from_params(**{**BASE, "tables": ["shop.orders", "shop.items"],
                                      "resnapshot_tables": ["shop.items"],
                                      "snapshot_filters": {"shop.x": "a = 1", "shop.orders": "a = 1; DROP TABLE t",
                                                           "shop.items": "(a = 1"},
                                      "max_rows_per_second": -3})  # fmt: skip
    text = str(err.value)
    assert "snapshot_filters names ['shop.x'], which are not in tables" in text
    assert "without ';' or comments" in text and "unbalanced parentheses" in text
    assert "in both resnapshot_tables and snapshot_filters" not in text  # shop.items was refused already
    assert "max_rows_per_second must be >= 1, got -3" in text
    with pytest.raises(PipelineConfigError, match="in both resnapshot_tables and snapshot_filters"):
        PipelineConfig.from_params(**{**BASE, "resnapshot_tables": ["shop.orders"],
                                      "snapshot_filters": {"shop.orders": "a = 1"}})  # fmt: skip


def test_changelog_tables_take_names_and_patterns_of_captured_tables() -> None:
    c = PipelineConfig.from_params(**{**BASE, "tables": ["shop.*"], "changelog_tables": "shop.orders, shop.item_*"})
    assert c.changelog_tables == ["shop.orders", "shop.item_*"]
    assert c.has_changelog("shop.orders") and c.has_changelog("shop.item_x") and not c.has_changelog("shop.users")
    assert not PipelineConfig.from_params(**BASE).has_changelog("shop.orders")
    with pytest.raises(PipelineConfigError, match=r"changelog_tables names \['crm.users'\], which are not in tables"):
        PipelineConfig.from_params(**{**BASE, "changelog_tables": ["crm.users", "crm.*"]})
