"""SQL range predicates: literals, and composite keys as the expanded row-value comparison."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import sqlite3
from decimal import Decimal

import pytest

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.chunking import splits_from_boundaries
from airflow_provider_mysqlcdc.core.keys import Collation, KeyColumn
from airflow_provider_mysqlcdc.core.predicate import quote_ident, range_condition, split_condition, sql_literal

A = KeyColumn("a", keys.INT)
B = KeyColumn("b", keys.INT)
C = KeyColumn("c", keys.INT)
S = KeyColumn("s", keys.STRING, "utf8mb4_general_ci")


def _hex(s: str) -> str:
    return "_utf8mb4 X'" + s.encode().hex() + "'"


# ------------------------------------------------------------------ literals
def test_quote_ident_escapes_backticks() -> None:
    assert quote_ident("id") == "`id`"
    assert quote_ident("we`ird") == "`we``ird`"


def test_int_and_decimal_literals() -> None:
    assert sql_literal(A, 2**64 - 1) == "18446744073709551615"
    assert sql_literal(A, "-7") == "-7"
    d = KeyColumn("d", keys.DECIMAL)
    assert sql_literal(d, Decimal("1E+5")) == "100000"  # never scientific notation
    assert sql_literal(d, Decimal("-0.0001")) == "-0.0001"
    assert sql_literal(d, "12345678901234567.8901") == "12345678901234567.8901"
    for bad in ("NaN", "Infinity"):
        with pytest.raises(ValueError, match="non-finite"):
            sql_literal(d, Decimal(bad))
    with pytest.raises(ValueError):
        sql_literal(A, "1; DROP TABLE t")


def test_string_literal_is_hex_with_charset_introducer() -> None:
    evil = "x' OR 1=1 -- \\"
    lit = sql_literal(S, evil)
    assert lit == _hex(evil)
    assert "'" not in lit[len("_utf8mb4 X'") : -1]
    latin1 = Collation(name="latin1_swedish_ci", method="weights", charset="latin1", codec="cp1252")
    col = KeyColumn("s", keys.STRING, "latin1_swedish_ci")
    want = "(CONVERT(_utf8mb4 X'c3a9' USING latin1) COLLATE latin1_swedish_ci)"  # converted by the server
    assert sql_literal(col, "é", {"latin1_swedish_ci": latin1}) == want
    bad = Collation(name="x", method="codepoint", charset="utf8mb4; DROP")
    with pytest.raises(ValueError, match="bad charset"):
        sql_literal(KeyColumn("s", keys.STRING, "x"), "a", {"x": bad})


def test_other_literals() -> None:
    assert sql_literal(KeyColumn("b", keys.BYTES), b"\x00'\xff") == "X'0027ff'"
    assert sql_literal(KeyColumn("f", keys.FLOAT), 0.1) == "0.1"
    assert sql_literal(KeyColumn("d", keys.DATE), dt.date(2026, 1, 2)) == "'2026-01-02'"
    assert sql_literal(KeyColumn("t", keys.DATETIME), dt.datetime(2026, 1, 2, 3, 4, 5, 6)) == (
        "'2026-01-02 03:04:05.000006'"
    )
    assert sql_literal(KeyColumn("t", keys.DATETIME), "2026-01-02 03:04:05'") == "'2026-01-02 03:04:05'"
    with pytest.raises(ValueError, match="unsupported key kind"):
        sql_literal(KeyColumn("u", "uuid"), "x")


# ------------------------------------------------------------------ single-column ranges
def test_single_column_ranges() -> None:
    assert range_condition([A], None, None) == "1=1"
    assert range_condition([A], (10,), None) == "(`a` >= 10)"
    assert range_condition([A], None, (20,)) == "(`a` < 20)"
    assert range_condition([A], (10,), (20,)) == "(`a` >= 10) AND (`a` < 20)"


def test_split_condition_per_split() -> None:
    splits = splits_from_boundaries("db.t", [A], [(10,), (20,)])
    assert [split_condition(s) for s in splits] == ["(`a` < 10)", "(`a` >= 10) AND (`a` < 20)", "(`a` >= 20)"]


# ------------------------------------------------------------------ composite keys
def test_composite_start_is_expanded_row_comparison() -> None:
    sql = range_condition([S, A], ("acme", 100), None)
    assert sql == f"((`s` > {_hex('acme')}) OR (`s` = {_hex('acme')} AND `a` >= 100))"


def test_composite_end_is_expanded_row_comparison() -> None:
    sql = range_condition([S, A], None, ("acme", 200))
    assert sql == f"((`s` < {_hex('acme')}) OR (`s` = {_hex('acme')} AND `a` < 200))"


def test_three_column_composite_range() -> None:
    sql = range_condition([A, B, C], (1, 2, 3), (4, 5, 6))
    assert sql == (
        "((`a` > 1) OR (`a` = 1 AND `b` > 2) OR (`a` = 1 AND `b` = 2 AND `c` >= 3))"
        " AND "
        "((`a` < 4) OR (`a` = 4 AND `b` < 5) OR (`a` = 4 AND `b` = 5 AND `c` < 6))"
    )


def test_composite_never_uses_per_column_and() -> None:
    for cols, start, end in [
        ([S, A], ("x", 1), ("y", 2)),
        ([A, B, C], (1, 2, 3), (1, 2, 9)),
    ]:
        sql = range_condition(cols, start, end)
        # "a >= x AND b >= y" (Flink CDC #2676): a non-strict comparison of a column followed by a
        # comparison of another one, inside one conjunct
        for conj in re.findall(r"\(([^()]*)\)", sql):
            ops = re.findall(r"`(\w+)` (>=|<=|<|>|=) ", conj)
            assert all(op == "=" for _, op in ops[:-1]), conj


def _sqlite_rows(cols: list[KeyColumn], values: list[tuple[int, ...]], cond: str) -> set[tuple[int, ...]]:
    db = sqlite3.connect(":memory:")
    names = ", ".join(quote_ident(c.name) for c in cols)
    db.execute(f"CREATE TABLE t ({names})")
    db.executemany(f"INSERT INTO t VALUES ({', '.join('?' for _ in cols)})", values)
    return set(db.execute(f"SELECT {names} FROM t WHERE {cond}").fetchall())


def test_composite_predicate_selects_exactly_the_row_value_range() -> None:
    """Evaluate the generated SQL (integers only, so any SQL engine agrees) against tuple order."""
    cols = [A, B, C]
    grid = list(itertools.product(range(4), range(4), range(4)))
    bounds = [(0, 3, 1), (1, 0, 0), (1, 2, 2), (2, 2, 3), (3, 0, 1)]
    splits = splits_from_boundaries("db.t", cols, bounds)
    seen: dict[tuple[int, ...], int] = {}
    for s in splits:
        got = _sqlite_rows(cols, grid, split_condition(s))
        want = {v for v in grid if (s.start is None or v >= s.start) and (s.end is None or v < s.end)}
        assert got == want, s
        for v in got:
            assert v not in seen
            seen[v] = s.split_id
    assert len(seen) == len(grid)


def test_naive_per_column_predicate_would_lose_rows() -> None:
    """Why the expansion matters: the naive form misses (1, 3, 0) from [(1, 2, 2), +inf)."""
    cols = [A, B, C]
    grid = list(itertools.product(range(4), range(4), range(4)))
    naive = "`a` >= 1 AND `b` >= 2 AND `c` >= 2"
    right = range_condition(cols, (1, 2, 2), None)
    assert (1, 3, 0) not in _sqlite_rows(cols, grid, naive)
    assert (1, 3, 0) in _sqlite_rows(cols, grid, right)
    assert (2, 0, 0) in _sqlite_rows(cols, grid, right)


def test_a_string_in_a_set_without_a_python_codec_is_converted_by_the_server() -> None:
    big5 = Collation(name="big5_chinese_ci", method="server", charset="big5")
    col = KeyColumn("s", keys.STRING, "big5_chinese_ci")
    want = "(CONVERT(_utf8mb4 X'e4b8ad' USING big5) COLLATE big5_chinese_ci)"
    assert sql_literal(col, "中", {"big5_chinese_ci": big5}) == want


def test_time_and_bit_literals() -> None:
    assert sql_literal(KeyColumn("t", keys.TIME), "-00:00:01.5") == "'-00:00:01.500000'"
    assert sql_literal(KeyColumn("b", keys.BIT), True) == "1"
