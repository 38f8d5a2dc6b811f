"""The plan's rules for ``metadata_columns`` and ``changelog_tables`` on plain data (plan_rules.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema
from airflow_provider_mysqlcdc.plan_rules import (
    PipelineStateError,
    check_changelog_location,
    check_metadata_columns,
    check_reserved_columns,
)

BASE = {"pipeline_id": "shop", "sink_root": "/lake", "state_root": "/state", "tables": ["shop.*"]}


def _captured(**flags: bool) -> SimpleNamespace:
    return SimpleNamespace(tables={f"shop.{t}": SimpleNamespace(metadata_columns=on) for t, on in flags.items()})


def test_the_option_cannot_change_for_a_captured_table() -> None:
    on = PipelineConfig.from_params(**BASE, metadata_columns=True)
    check_metadata_columns(on, None, ["shop.a"])  # nothing captured yet
    check_metadata_columns(on, _captured(a=True), ["shop.a", "shop.new"])  # type: ignore[arg-type]
    with pytest.raises(PipelineStateError, match=r"\['shop.b'\] were captured without them.*metadata_columns=false"):
        check_metadata_columns(on, _captured(a=True, b=False), ["shop.a", "shop.b"])  # type: ignore[arg-type]
    off = PipelineConfig.from_params(**BASE)
    with pytest.raises(PipelineStateError, match=r"\['shop.a'\] were captured with them"):
        check_metadata_columns(off, _captured(a=True), ["shop.a"])  # type: ignore[arg-type]


def test_a_source_column_may_not_take_a_metadata_column_s_name() -> None:
    schema = TableSchema(TableId("shop", "a"), [ColumnInfo("id", 1, "bigint", "bigint", False),
                                                ColumnInfo("_OP", 2, "varchar", "varchar(1)", True)])  # fmt: skip
    check_reserved_columns(PipelineConfig.from_params(**BASE), {"shop.a": schema})  # off: no clash possible
    with pytest.raises(PipelineStateError, match=r"'shop.a': \['_OP'\]"):
        check_reserved_columns(PipelineConfig.from_params(**BASE, metadata_columns=True), {"shop.a": schema})


def test_a_database_named_like_the_changelog_directory_is_refused_with_changelogs_on() -> None:
    tables = ["shop.a", "_changelog.t"]
    check_changelog_location(PipelineConfig.from_params(**{**BASE, "tables": ["*.*"]}), tables)
    with pytest.raises(PipelineStateError, match=r"\['_changelog.t'\] are in a database named _changelog"):
        config = PipelineConfig.from_params(**{**BASE, "tables": ["*.*"], "changelog_tables": ["shop.*"]})
        check_changelog_location(config, tables)
