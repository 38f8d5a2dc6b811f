"""Table patterns against a REAL MariaDB catalog: what a plan captures, skips and refuses.

The database holds what a real one does: tables with single, composite and case-insensitive
VARCHAR keys, a table without any key, a view, a MariaDB sequence and scratch tables. Patterns
select among them; the plan captures the capturable ones and says why it left each other one out,
while a problem with a table named exactly still fails the plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core.config import PipelineConfig
from airflow_provider_mysqlcdc.core.table_selection import TableSelection
from airflow_provider_mysqlcdc.mysql.checks import SourceCheckError
from airflow_provider_mysqlcdc.mysql.table_choice import choose_tables
from airflow_provider_mysqlcdc.pipeline import plan_run
from airflow_provider_mysqlcdc.state import StateStore
from tests.support.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CAPTURABLE = ["codes", "line_items", "orders_1", "orders_2", "orders_10"]


@pytest.fixture
def shop(mariadb: MariaDBServer, db: str) -> str:
    mariadb.execute(
        "CREATE TABLE orders_1 (id BIGINT NOT NULL PRIMARY KEY, v INT)",
        "CREATE TABLE orders_2 (id BIGINT NOT NULL PRIMARY KEY, v INT)",
        "CREATE TABLE orders_10 (id BIGINT NOT NULL PRIMARY KEY, v INT)",
        "CREATE TABLE line_items (order_id BIGINT NOT NULL, line_no INT NOT NULL, q INT, "
        "PRIMARY KEY (order_id, line_no))",
        "CREATE TABLE codes (code VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, label TEXT)",
        "CREATE TABLE nokey (a INT, b INT)",
        "CREATE TABLE tmp_scratch (id INT NOT NULL PRIMARY KEY)",
        "CREATE VIEW v_orders AS SELECT id, v FROM orders_1",
        "CREATE SEQUENCE s_ids",
        "INSERT INTO orders_1 SELECT seq, seq FROM seq_1_to_300",
        "INSERT INTO line_items SELECT seq DIV 3, seq MOD 3, seq FROM seq_1_to_300",
        "INSERT INTO codes SELECT CONCAT('Code-', seq), 'x' FROM seq_1_to_100",
        database=db,
    )
    return db


def _choose(conn: Any, tables: list[str], exclude: list[str] | None = None) -> Any:
    return choose_tables(conn, TableSelection.parse(tables, exclude or []))


def test_a_database_pattern_captures_the_tables_and_says_why_it_skipped_the_rest(cdc_conn: Any, shop: str) -> None:
    choice = _choose(cdc_conn, [f"{shop}.*"], [f"{shop}.tmp_*"])
    assert sorted(choice.tables) == sorted(f"{shop}.{t}" for t in CAPTURABLE)
    assert list(choice.skipped) == [f"{shop}.nokey"]
    assert "primary key" in choice.skipped[f"{shop}.nokey"]
    assert choice.not_tables == {f"{shop}.v_orders": "VIEW", f"{shop}.s_ids": "SEQUENCE"}
    assert choice.excluded == [f"{shop}.tmp_scratch"]
    assert choice.report.ok and choice.report.tables == choice.tables
    notes = "\n".join(choice.notes())
    assert f"skipped {shop}.nokey" in notes and "a view, not a table" in notes and "tmp_scratch" in notes


def test_a_regex_matches_the_whole_name(cdc_conn: Any, shop: str) -> None:
    choice = _choose(cdc_conn, [rf"{shop}\.orders_[0-9]"])
    assert choice.tables == [f"{shop}.orders_1", f"{shop}.orders_2"]  # orders_10: the whole name must match
    assert _choose(cdc_conn, [rf"{shop}\.orders_[0-9]+"]).tables == [f"{shop}.orders_1", f"{shop}.orders_10",
                                                                      f"{shop}.orders_2"]  # fmt: skip


def test_a_table_named_exactly_that_cannot_be_captured_is_skipped_and_a_misspelt_one_fails(
    mariadb: MariaDBServer, cdc_conn: Any, shop: str
) -> None:
    """One table never fails the run for the others: a table without a key, or keyed by a string
    whose collation cannot be placed exactly (several levels under PAD SPACE), is skipped with its
    reason even when named exactly; a name that matches no table is the user's typo and fails."""
    mariadb.execute(
        "CREATE TABLE levels (k VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_uca1400_as_cs NOT NULL PRIMARY KEY)",
        "CREATE TABLE uca (k VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_uca1400_ai_ci NOT NULL PRIMARY KEY)",
        database=shop,
    )
    choice = _choose(cdc_conn, [f"{shop}.orders_*", f"{shop}.nokey", f"{shop}.levels", f"{shop}.uca"])
    assert sorted(choice.tables) == [f"{shop}.orders_1", f"{shop}.orders_10", f"{shop}.orders_2", f"{shop}.uca"]
    assert sorted(choice.skipped) == [f"{shop}.levels", f"{shop}.nokey"]
    assert "primary key" in choice.skipped[f"{shop}.nokey"]
    assert "utf8mb4_uca1400_as_cs" in choice.skipped[f"{shop}.levels"]
    assert "chunk_key_columns" in choice.skipped[f"{shop}.levels"]  # the way out
    assert choice.report.ok
    with pytest.raises(SourceCheckError) as exc:
        _choose(cdc_conn, [f"{shop}.orders_*", f"{shop}.ordrs_1"])
    assert [p.table for p in exc.value.report.problems] == [f"{shop}.ordrs_1"]
    assert "does not exist" in str(exc.value)


def test_a_selection_that_matches_nothing_capturable_names_the_patterns(cdc_conn: Any, shop: str) -> None:
    with pytest.raises(SourceCheckError, match=r"select no table that can be captured.*patterns that matched no"):
        _choose(cdc_conn, [f"{shop}.zz_*"])
    with pytest.raises(SourceCheckError, match=r"skipped .*nokey"):
        _choose(cdc_conn, [f"{shop}.no*"])


def test_the_plan_snapshots_what_the_patterns_select(cdc_conn: Any, shop: str, tmp_path: Path) -> None:
    config = PipelineConfig.from_params(
        pipeline_id="sel", sink_root=str(tmp_path / "lake"), state_root=str(tmp_path / "state"),
        tables=[f"{shop}.*"], exclude_tables=[rf"{shop}\.tmp_.*"], resnapshot_tables=[],
    )  # fmt: skip
    outcome = plan_run(cdc_conn, StateStore(config.state_root, "sel"), config, "plan-1", lambda t: False)
    assert sorted(outcome.snapshot_tables) == sorted(f"{shop}.{t}" for t in CAPTURABLE)
    summary = outcome.to_dict()["selected_tables"]
    assert list(summary["skipped"]) == [f"{shop}.nokey"] and summary["excluded"] == [f"{shop}.tmp_scratch"]
    assert any(n.startswith(f"skipped {shop}.nokey") for n in outcome.notes)
    assert outcome.chunks >= len(CAPTURABLE)


def test_cli_check_lists_the_selection(mariadb: MariaDBServer, shop: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__"))}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW_CONN_MYSQL_CDC_DEFAULT=mariadb.airflow_conn_json())  # fmt: skip
    cmd = [sys.executable, "-m", "airflow_provider_mysqlcdc", "check", "--json",
           "--tables", f"{shop}.*", "--exclude-tables", f"{shop}.tmp_*"]  # fmt: skip
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert sorted(report["tables"]) == sorted(f"{shop}.{t}" for t in CAPTURABLE)
    assert any("nokey" in n for n in report["selection_notes"])
    bad = subprocess.run([*cmd[:-4], "--tables", f"{shop}.order_[0-9"], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "not a valid regular expression" in bad.stderr and "Traceback" not in bad.stderr
