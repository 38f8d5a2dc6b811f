"""Table selection on plain data: which entry is a name, a glob or a regex, and what each selects."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig, PipelineConfigError
from airflow_provider_mysqlcdc.core.table_selection import CatalogTable, TablePattern, TableSelection

CATALOG = [CatalogTable(n) for n in (
    "shop.orders", "shop.order_1", "shop.order_22", "shop.tmp_a", "shopping.carts", "db_0.orders_0",
    "db_1.orders_1", "db_1.orders_x", "Shop.Orders", "other.t",
)] + [CatalogTable("shop.v_orders", "VIEW"), CatalogTable("shop.ids", "SEQUENCE")]  # fmt: skip


@pytest.mark.parametrize(("text", "kind"), [
    ("shop.orders", "exact"), ("`shop`.`orders`", "exact"), ("shop.*", "glob"), ("*.*", "glob"),
    ("shop.order_?", "glob"), (r"shop\.order_[0-9]+", "regex"), (r"db_[0-9]+\.orders_[0-9]+", "regex"),
])  # fmt: skip
def test_kinds(text: str, kind: str) -> None:
    assert TablePattern.parse(text).kind == kind


@pytest.mark.parametrize(("text", "fragment"), [
    ("orders", "<database>.<table>"), ("shop.*.x", "<database>.<table> with * or ?"),
    (r"shop\.order_[0-9", "not a valid regular expression"), ("", "not a table name or pattern"),
])  # fmt: skip
def test_bad_entries_name_the_fix(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("*", r"\*").replace("?", r"\?").replace(".", r"\.")):
        TablePattern.parse(text)


def test_a_glob_stays_within_its_part_and_is_case_sensitive() -> None:
    res = TableSelection.parse(["shop.*"]).resolve(CATALOG)
    assert res.tables == ["shop.orders", "shop.order_1", "shop.order_22", "shop.tmp_a"]  # not shopping.*, Shop.*
    assert res.not_tables == {"shop.v_orders": "VIEW", "shop.ids": "SEQUENCE"}
    assert TableSelection.parse(["*.*"]).resolve(CATALOG).tables == [c.name for c in CATALOG[:10]]


def test_a_regex_must_match_the_whole_name() -> None:
    res = TableSelection.parse([r"db_[0-9]+\.orders_[0-9]+"]).resolve(CATALOG)
    assert res.tables == ["db_0.orders_0", "db_1.orders_1"]
    assert TableSelection.parse([r"shop\.order_[0-9]"]).resolve(CATALOG).tables == ["shop.order_1"]


def test_exclusions_apply_to_patterns_and_names_and_are_reported() -> None:
    sel = TableSelection.parse(["shop.*", "other.t"], ["shop.tmp_*", "other.t"])
    res = sel.resolve(CATALOG)
    assert res.tables == ["shop.orders", "shop.order_1", "shop.order_22"]
    assert res.excluded == ["other.t", "shop.tmp_a"]
    assert sel.selects("shop.orders") and not sel.selects("shop.tmp_a") and not sel.selects("other.t")


def test_exact_names_are_kept_even_when_absent_and_patterns_without_a_match_are_listed() -> None:
    res = TableSelection.parse(["nope.t", "zz.*"]).resolve(CATALOG)
    assert res.tables == ["nope.t"] and res.exact == {"nope.t"}  # the source check says it does not exist
    assert res.unmatched_patterns == ["zz.*"]


def test_config_accepts_patterns_and_checks_resnapshot_against_the_selection() -> None:
    base = {"pipeline_id": "p", "sink_root": "/l", "state_root": "/s"}
    cfg = PipelineConfig.from_params(**base, tables=["shop.*"], exclude_tables="shop.tmp_*",
                                     resnapshot_tables=["shop.orders"])  # fmt: skip
    assert cfg.tables == ["shop.*"] and cfg.exclude_tables == ["shop.tmp_*"]
    assert cfg.selection.selects("shop.orders")
    with pytest.raises(PipelineConfigError, match=r"resnapshot_tables \['shop.tmp_a'\] are not in tables.*exclude"):
        PipelineConfig.from_params(**base, tables=["shop.*"], exclude_tables=["shop.tmp_*"],
                                   resnapshot_tables=["shop.tmp_a"])  # fmt: skip
    with pytest.raises(PipelineConfigError, match=r"exclude_tables: .*not a valid regular expression"):
        PipelineConfig.from_params(**base, tables=["shop.*"], exclude_tables=[r"shop\.x["])
    assert PipelineConfig.from_params(**base, tables='["shop\\\\.order_[0-9]+"]').tables == [r"shop\.order_[0-9]+"]
