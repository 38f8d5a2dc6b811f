"""Routes of sharded tables (core/routing.py): parsing, matching, the shard's identity in the shared
table, and the plan's schema comparison."""

from __future__ import annotations

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig, PipelineConfigError
from airflow_provider_mysqlcdc.core.routing import Routes, incompatible_shards

BASE = {"pipeline_id": "p", "sink_root": "/lake", "state_root": "/state", "tables": ["db_*.orders_*"]}


def _parse(value: object) -> tuple[Routes, list[str]]:
    problems: list[str] = []
    return Routes.parse(value, problems), problems


def test_first_matching_route_wins_and_unrouted_tables_stay_alone() -> None:
    routes, problems = _parse([{"source": r"db_[0-9]+\.orders_[0-9]+", "target": "shop.orders"},
                               {"source": "db_*.*", "target": "shop.rest"}])  # fmt: skip
    assert not problems
    assert routes.route_of("db_3.orders_12").target == "shop.orders"  # type: ignore[union-attr]
    assert routes.route_of("db_3.items").target == "shop.rest"  # type: ignore[union-attr]
    assert routes.route_of("other.orders_1") is None
    assert routes.route_of("db_x.orders_1").target == "shop.rest"  # type: ignore[union-attr]
    assert routes.targets() == ["shop.orders", "shop.rest"]


def test_a_shard_has_its_own_partition_app_id_and_key() -> None:
    routes, _ = _parse('[{"source": "db_?.o", "target": "shop.o"}]')  # JSON text, as a templated param
    r = routes.route_of("db_1.o")
    assert r is not None
    assert r.partition_values == {"_source_database": "db_1", "_source_table": "o"}
    assert r.app_id("app") != routes.route_of("db_2.o").app_id("app")  # type: ignore[union-attr]
    assert r.merge_key(["id"]) == ["_source_database", "_source_table", "id"]
    assert r.predicate() == "`_source_database` = 'db_1' AND `_source_table` = 'o'"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("not json", "JSON list"),
        ({"source": "a.b", "target": "c.d"}, "must be a list"),
        ([{"source": "a.*"}], "exactly the keys source and target"),
        ([{"source": "a.*", "target": "c.*"}], "not a pattern"),
        ([{"source": "a(", "target": "c.d"}], "regular expression"),
    ],
)
def test_bad_routes_are_explained(value: object, fragment: str) -> None:
    routes, problems = _parse(value)
    assert not routes.rules and len(problems) == 1 and fragment in problems[0], problems


def test_config_records_routes_and_refuses_an_unselected_exact_source() -> None:
    c = PipelineConfig.from_params(**BASE, routes=[{"source": "db_*.orders_*", "target": "shop.orders"}])
    assert c.routing.route_of("db_1.orders_2").target == "shop.orders"  # type: ignore[union-attr]
    with pytest.raises(PipelineConfigError, match="a route applies to captured tables only"):
        PipelineConfig.from_params(**BASE, routes=[{"source": "other.t", "target": "shop.t"}])


def test_shards_must_agree_on_columns_types_and_key() -> None:
    same = ({"id": "int64", "v": "string"}, ["id"])
    assert incompatible_shards("shop.o", {"a.o": same, "b.o": same}) is None
    assert incompatible_shards("shop.o", {"a.o": same}) is None
    # a column only some shards have (an ADD COLUMN rolling through them) reads NULL in the others
    assert incompatible_shards("shop.o", {"a.o": same, "b.o": ({"id": "int64", "w": "string"}, ["id"])}) is None
    why = incompatible_shards("shop.o", {"a.o": same, "b.o": ({"id": "int32", "w": "string"}, ["id", "w"])})
    assert why is not None
    for part in ("shop.o", "id: int64 in a.o, int32 in b.o", "primary key: ['id'] in a.o, ['id', 'w'] in b.o"):
        assert part in why, why
    assert "v:" not in why and "w:" not in why
