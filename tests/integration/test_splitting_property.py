"""Property test of chunk splitting on a real server: every row lies in exactly one split.

A seeded generator (``MYSQLCDC_SPLIT_SEED`` overrides the seed; each case has its own RNG, so a
failing case is reproduced by its id alone) builds tables of many shapes: dense/sparse/clustered
integer ids, BIGINT UNSIGNED keys up to 2^64-1, DECIMAL(20,4) keys, VARCHAR keys under
``utf8mb4_general_ci``/``utf8mb4_unicode_ci``/``utf8mb4_bin``/``utf8mb4_nopad_bin`` with values that
differ only by case, accents or trailing spaces, composite (VARCHAR, INT) keys with a constant
first column, FLOAT/DOUBLE keys, empty and single-row tables. Chunk sizes are small so each table
yields many chunks.

For every table the splits from :func:`split_table` are checked

(a) on the server: each split's predicate (:func:`split_condition`) as ``COUNT(*)`` and as a
    ``SELECT`` of the keys; the counts add up to the table's, and no row or key is in two splits;
(b) in Python: :class:`ChunkLocator` (binary search) and :meth:`SnapshotChunk.contains`, with the
    collations of the split result, place every row in the split the server put it in. The same is
    done for a probe table (same column types, no key) holding keys *not* in the table — each
    boundary's case/accent/padding variants and neighbours — as binlog events would bring them;

and no split holds more than ``2 x chunk_size`` rows unless all its rows share one key value.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from airflow_provider_mysqlcdc.core import keys
from airflow_provider_mysqlcdc.core.chunk import ChunkLocator
from airflow_provider_mysqlcdc.core.keys import Collation, KeyOrder
from airflow_provider_mysqlcdc.core.predicate import quote_ident, split_condition
from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.splitter import SplitOptions, TableSplitResult, split_table
from tests.support.mariadb import MariaDBServer

# A splitter that never advances must fail the test, not hang the run.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SEED = int(os.environ.get("MYSQLCDC_SPLIT_SEED", "20261101"))
U64_MAX = 2**64 - 1
DEC_MAX = Decimal("9999999999999999.9999")  # DECIMAL(20,4)
Q4 = Decimal("0.0001")

INT = "INT NOT NULL"
BIGINT = "BIGINT NOT NULL"
UBIGINT = "BIGINT UNSIGNED NOT NULL"
DEC = "DECIMAL(20,4) NOT NULL"


def varchar(collation: str) -> str:
    return f"VARCHAR(64) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"


# Letters that collide under case/accent-insensitive collations, padding characters below and at
# space, an expansion (ß = ss under unicode_ci), characters above U+FFFF (equal under general_ci,
# apart under the UCA 5.2+ ones), and the letters of the Spanish contractions (ch, ll).
ALPHABET = "aaAábBbeEéÈsSßzZø09_- \t" + "\U0001f600\U0001f601" + "cChHlL"
ACCENTS = str.maketrans("aAeEoO", "áÁéÉóÓ")


def rand_string(rng: random.Random) -> str:
    n = rng.choice([0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 6, 8])
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def string_variants(s: str) -> list[str]:
    """Values equal to, or just around, ``s`` under some collation."""
    return [
        s, s.upper(), s.lower(), s.swapcase(), s.translate(ACCENTS), s + " ", s + "  ", s + "\t",
        s + "\x01", s.rstrip(" "), s[:-1], s + "a", s + " !", s.replace("ss", "ß"), s.replace("ß", "ss"),
    ]


def mixed_strings(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    for _ in range(n):
        if out and rng.random() < 0.3:
            out.append(rng.choice(string_variants(rng.choice(out))))
        else:
            out.append(rand_string(rng))
    return out


def chunk_size(rng: random.Random) -> int:
    """Small chunk sizes (7..200), biased low so tables of a few thousand rows give many chunks."""
    return rng.choice([7, rng.randint(7, 20), rng.randint(7, 60), rng.randint(7, 200)])


@dataclass
class Case:
    name: str
    columns: list[tuple[str, str]]  # (name, type) of the key columns, in key order
    rows: list[tuple[Any, ...]]  # key values (duplicates under the PK are dropped by INSERT IGNORE)
    chunk_size: int
    method: str | None  # expected split method, None = either
    primary_key: bool = True
    options: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ generators
def g_int_dense(rng: random.Random) -> Case:
    n, lo = rng.randint(300, 3000), rng.randint(-(10**6), 10**6)
    return Case("int_dense", [("id", INT)], [(lo + i,) for i in range(n)], chunk_size(rng), "even")


def g_int_sparse_even(rng: random.Random) -> Case:
    n, stride = rng.randint(300, 2000), rng.randint(2, 400)
    ids = rng.sample(range(1, n * stride), n)
    return Case("int_sparse_even", [("id", BIGINT)], [(i,) for i in ids], chunk_size(rng), "even")


def g_int_sparse_uneven(rng: random.Random) -> Case:
    n = rng.randint(300, 2000)
    ids = rng.sample(range(-(2**31), 2**31 - 1), n)
    return Case("int_sparse_uneven", [("id", INT)], [(i,) for i in ids], chunk_size(rng), "uneven")


def g_clustered_far(rng: random.Random) -> Case:
    n = rng.randint(200, 1500)
    ids = [*range(1, n + 1), *range(10**12, 10**12 + n)]
    return Case("clustered_far", [("id", BIGINT)], [(i,) for i in ids], chunk_size(rng), "uneven")


def g_clustered_near(rng: random.Random) -> Case:
    # Factor ~100: the even path applies, each dense run lands in one huge bucket (oversize ->
    # re-split by the uneven method).
    n = rng.randint(300, 1500)
    gap = n * rng.randint(100, 300)
    ids = [*range(1, n + 1), *range(gap, gap + n)]
    return Case("clustered_near", [("id", BIGINT)], [(i,) for i in ids], chunk_size(rng), "even")


def g_u64_dense_top(rng: random.Random) -> Case:
    n = rng.randint(300, 2500)
    ids = [U64_MAX - i for i in range(n)]
    rng.shuffle(ids)
    return Case("u64_dense_top", [("id", UBIGINT)], [(i,) for i in ids], chunk_size(rng), "even")


def g_u64_sparse_top(rng: random.Random) -> Case:
    n = rng.randint(300, 2000)
    ids = {U64_MAX, U64_MAX - 1}
    while len(ids) < n:
        ids.add(U64_MAX - rng.randrange(n * 50))
    return Case("u64_sparse_top", [("id", UBIGINT)], [(i,) for i in ids], chunk_size(rng), "even")


def g_u64_extremes(rng: random.Random) -> Case:
    ids = {0, 1, 2**63 - 1, 2**63, 2**63 + 1, U64_MAX - 1, U64_MAX}
    while len(ids) < rng.randint(300, 1000):
        ids.add(rng.randrange(2**64))
    return Case("u64_extremes", [("id", UBIGINT)], [(i,) for i in ids], chunk_size(rng), "uneven")


def g_decimal_quarters(rng: random.Random) -> Case:
    n, lo = rng.randint(300, 2500), rng.randint(-5000, 5000)
    vals = [(Decimal(lo) + Decimal(i) / 4).quantize(Q4) for i in range(n)]
    return Case("decimal_quarters", [("d", DEC)], [(v,) for v in vals], chunk_size(rng), "even")


def g_decimal_random(rng: random.Random) -> Case:
    n = rng.randint(300, 2500)
    vals = {(Decimal(rng.randint(-(10**9), 10**9)) * Q4) for _ in range(n)}
    return Case("decimal_random", [("d", DEC)], [(v,) for v in vals], chunk_size(rng), None)


def g_decimal_huge(rng: random.Random) -> Case:
    n = rng.randint(300, 2000)
    vals = {DEC_MAX, -DEC_MAX}
    while len(vals) < n:
        vals.add(DEC_MAX - Decimal(rng.randrange(n * 20_000)) * Q4)
    return Case("decimal_huge", [("d", DEC)], [(v,) for v in vals], chunk_size(rng), "uneven")


def g_decimal_near_max(rng: random.Random) -> Case:
    n = rng.randint(300, 2000)
    vals = {DEC_MAX - Decimal(rng.randrange(n * 3)) for _ in range(n)}
    return Case("decimal_near_max", [("d", DEC)], [(v,) for v in vals], chunk_size(rng), "even")


def g_float_random(rng: random.Random) -> Case:
    vals = [(rng.uniform(-1e3, 1e3),) for _ in range(rng.randint(300, 2000))]
    return Case("float_random", [("f", "FLOAT NOT NULL")], vals, chunk_size(rng), "uneven")


def g_float_dense(rng: random.Random) -> Case:
    # Consecutive float32 values: ~84 of them print alike ("1.00001") with FLOAT's 6 significant
    # digits; boundaries read as that text made the uneven loop spin forever.
    n = rng.randint(300, 2000)
    return Case("float_dense", [("f", "FLOAT NOT NULL")], [(1 + i * 2.0**-23,) for i in range(n)], 7, "uneven")


def g_double_random(rng: random.Random) -> Case:
    vals = [(rng.choice([-1, 1]) * rng.uniform(0, 1) * 10.0 ** rng.randint(-300, 300),) for _ in range(1000)]
    return Case("double_random", [("f", "DOUBLE NOT NULL")], vals, chunk_size(rng), "uneven")


def _g_varchar(collation: str) -> Callable[[random.Random], Case]:
    def gen(rng: random.Random) -> Case:
        vals = mixed_strings(rng, rng.randint(300, 2500))
        return Case(f"varchar_{collation}", [("s", varchar(collation))], [(v,) for v in vals],
                    chunk_size(rng), "uneven")
    return gen


def _g_composite_const(collation: str) -> Callable[[random.Random], Case]:
    def gen(rng: random.Random) -> Case:
        n = rng.randint(300, 2500)
        first = rng.choice(["acme", "Acme", "ÁCME "])
        ids = rng.sample(range(-(10**6), 10**6), n)
        return Case(f"composite_const_{collation}", [("tenant", varchar(collation)), ("id", INT)],
                    [(first, i) for i in ids], chunk_size(rng), "uneven")
    return gen


def _g_composite_mixed(collation: str) -> Callable[[random.Random], Case]:
    def gen(rng: random.Random) -> Case:
        names = [*mixed_strings(rng, 12), "acme", "ACME", "Acme ", "ácme", "beta", "béta"]
        rows = [(rng.choice(names), rng.randint(-50, 50)) for _ in range(rng.randint(300, 2500))]
        return Case(f"composite_mixed_{collation}", [("tenant", varchar(collation)), ("id", INT)], rows,
                    chunk_size(rng), "uneven")
    return gen


def g_empty_int(rng: random.Random) -> Case:
    return Case("empty_int", [("id", INT)], [], chunk_size(rng), "empty")


def g_empty_varchar(rng: random.Random) -> Case:
    return Case("empty_varchar", [("s", varchar("utf8mb4_general_ci"))], [], chunk_size(rng), "empty")


def g_single_int(rng: random.Random) -> Case:
    return Case("single_int", [("id", UBIGINT)], [(U64_MAX,)], chunk_size(rng), "even")


def g_single_varchar(rng: random.Random) -> Case:
    return Case("single_varchar", [("s", varchar("utf8mb4_unicode_ci"))], [("Äb ",)], 7, "uneven")


GENERATORS: list[tuple[Callable[[random.Random], Case], int]] = [
    (g_int_dense, 3),
    (g_int_sparse_even, 2),
    (g_int_sparse_uneven, 2),
    (g_clustered_far, 2),
    (g_clustered_near, 2),
    (g_u64_dense_top, 2),
    (g_u64_sparse_top, 1),
    (g_u64_extremes, 1),
    (g_decimal_quarters, 2),
    (g_decimal_random, 1),
    (g_decimal_huge, 1),
    (g_decimal_near_max, 1),
    (g_float_random, 1),
    (g_float_dense, 1),
    (g_double_random, 1),
    (_g_varchar("utf8mb4_general_ci"), 3),
    (_g_varchar("utf8mb4_unicode_ci"), 2),
    (_g_varchar("utf8mb4_bin"), 1),
    (_g_varchar("utf8mb4_nopad_bin"), 1),
    # ordered by the server's weight strings (core/keys, method "server")
    (_g_varchar("utf8mb4_uca1400_ai_ci"), 2),  # MariaDB 11's default
    (_g_varchar("utf8mb4_unicode_520_ci"), 1),  # characters above U+FFFF weigh apart
    (_g_varchar("utf8mb4_spanish2_ci"), 1),  # contractions: ch, ll
    (_g_varchar("utf8mb4_uca1400_spanish2_ai_ci"), 1),
    (_g_varchar("utf8mb4_uca1400_nopad_as_cs"), 1),  # several levels, no pad: bytes of the weight strings
    (_g_composite_const("utf8mb4_general_ci"), 2),
    (_g_composite_mixed("utf8mb4_unicode_ci"), 1),
    (_g_composite_mixed("utf8mb4_bin"), 1),
    (g_empty_int, 1),
    (g_empty_varchar, 1),
    (g_single_int, 1),
    (g_single_varchar, 1),
]

CASES: list[tuple[Callable[[random.Random], Case], int]] = [(gen, i) for gen, k in GENERATORS for i in range(k)]
CASE_IDS = [f"{gen(random.Random(0)).name}-{i}" for gen, i in CASES]


def make_case(gen: Callable[[random.Random], Case], i: int) -> Case:
    """Case ``i`` of a generator; its RNG depends only on the seed, the shape and ``i``."""
    name = gen(random.Random(0)).name
    return gen(random.Random(f"{SEED}/{name}/{i}"))


# ------------------------------------------------------------------ table plumbing
def create_and_load(
    mariadb: MariaDBServer, db: str, table: str, columns: list[tuple[str, str]], rows: list[tuple[Any, ...]],
    primary_key: bool,
) -> None:
    cols = ", ".join(f"{quote_ident(n)} {t}" for n, t in columns)
    pk = f", PRIMARY KEY ({', '.join(quote_ident(n) for n, _ in columns)})" if primary_key else ""
    mariadb.execute(f"CREATE TABLE {quote_ident(table)} ({cols}, rid INT NOT NULL{pk})", database=db)
    if rows:
        names = ", ".join([*(quote_ident(n) for n, _ in columns), "rid"])
        marks = ", ".join(["%s"] * (len(columns) + 1))
        with mariadb.root_connection(db) as conn, conn.cursor() as cur:
            cur.executemany(
                f"INSERT IGNORE INTO {quote_ident(table)} ({names}) VALUES ({marks})",
                [(*r, rid) for rid, r in enumerate(rows)],
            )


def query(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


def probe_keys(result: TableSplitResult, rows: list[tuple[Any, ...]], rng: random.Random) -> list[tuple[Any, ...]]:
    """Keys around every boundary and a few stored keys, in every column's own terms."""
    edges = [s.start for s in result.splits if s.start is not None]
    edges += rng.sample(rows, min(5, len(rows)))
    out: list[tuple[Any, ...]] = []
    for e in edges:
        per_col = [neighbours(col.kind, v) for col, v in zip(result.key_columns, e, strict=True)]
        out += itertools.product(*per_col)
    return out


def neighbours(kind: str, v: Any) -> list[Any]:
    """``v`` and the values just around it (variants equal under some collation for strings)."""
    if kind == keys.STRING:
        return string_variants(v)
    if kind == keys.DECIMAL:
        return [v - Q4, v, v + Q4]
    if kind == keys.INT:
        return [v - 1, v, v + 1]
    if kind == keys.FLOAT:
        return [math.nextafter(v, -math.inf), v, math.nextafter(v, math.inf)]
    if kind == keys.BYTES:
        return [v, v + b"\x00", v + b" ", v[:-1], v + b"\xff"]
    if kind == keys.DATE:
        return [v - dt.timedelta(days=1), v, v + dt.timedelta(days=1)]
    if kind == keys.DATETIME:
        return [v - dt.timedelta(microseconds=1), v, v + dt.timedelta(microseconds=1)]
    raise AssertionError(f"no neighbours for key kind {kind}")


@dataclass
class Placement:
    split_of: dict[int, int]  # rid -> split index the server selected it in
    keys_of: dict[int, tuple[Any, ...]]  # rid -> stored key
    counts: list[int]  # per split: COUNT(*)


def key_select(result: TableSplitResult) -> str:
    """The key columns' exact values: a FLOAT prints with 6 significant digits, the binlog (and
    CAST AS DOUBLE) gives the stored value."""
    return ", ".join(
        f"CAST({quote_ident(c.name)} AS DOUBLE)" if c.kind == keys.FLOAT else quote_ident(c.name)
        for c in result.key_columns
    )


def server_placement(conn: Any, table: str, result: TableSplitResult) -> Placement:
    kcols = key_select(result)
    qt = TableId(result.schema.table.database, table).quoted
    keys_of = {r[0]: tuple(r[1:]) for r in query(conn, f"SELECT rid, {kcols} FROM {qt}")}
    split_of: dict[int, int] = {}
    counts: list[int] = []
    for s in result.splits:
        cond = split_condition(s, result.collations)
        (n,) = query(conn, f"SELECT COUNT(*) FROM {qt} WHERE {cond}")[0]
        got = query(conn, f"SELECT rid, {kcols} FROM {qt} WHERE {cond}")
        assert len(got) == n
        for rid, *k in got:
            assert rid not in split_of, (
                f"{table}: row {rid} key {k!r} is in splits {split_of[rid]} and {s.split_id}"
            )
            assert tuple(k) == keys_of[rid]
            split_of[rid] = s.split_id
        counts.append(n)
    total = query(conn, f"SELECT COUNT(*) FROM {qt}")[0][0]
    assert sum(counts) == total == len(keys_of), f"{table}: splits hold {sum(counts)} of {total} rows"
    missing = set(keys_of) - set(split_of)
    assert not missing, f"{table}: rows in no split: {[keys_of[r] for r in sorted(missing)[:10]]}"
    return Placement(split_of, keys_of, counts)


def python_agrees(result: TableSplitResult, placement: Placement, label: str) -> None:
    loc = ChunkLocator(result.splits, result.collations)  # also checks the splits tile the key space
    order = loc.order
    splits = loc.splits
    for rid, key in placement.keys_of.items():
        want = placement.split_of[rid]
        got = loc.locate(key).split_id
        assert got == want, f"{label}: key {key!r} is in split {want} on the server, Python says {got}"
        assert splits[want].contains(key, order)
        for nb in (want - 1, want + 1):
            if 0 <= nb < len(splits):
                assert not splits[nb].contains(key, order), f"{label}: {key!r} also in split {nb}"


def check_sizes(conn: Any, result: TableSplitResult, placement: Placement, chunk: int, order: KeyOrder) -> None:
    by_split: dict[int, set[Any]] = {}
    for rid, s in placement.split_of.items():
        by_split.setdefault(s, set()).add(order.sort_key(placement.keys_of[rid]))
    for s, n in enumerate(placement.counts):
        if n > 2 * chunk:
            assert len(by_split[s]) == 1, (
                f"{result.schema.table}: split {s} holds {n} rows (> 2 x {chunk}) of {len(by_split[s])} key values"
            )
            split = result.splits[s]
            kcols = ", ".join(quote_ident(c.name) for c in result.key_columns)
            (distinct,) = query(
                conn,
                f"SELECT COUNT(DISTINCT {kcols}) FROM {result.schema.table.quoted} "
                f"WHERE {split_condition(split, result.collations)}",
            )[0]
            assert distinct == 1


_COLLATIONS: dict[str, Collation] = {}  # fetched once per run (one 64k-row query per collation)


def split_and_verify(
    mariadb: MariaDBServer, db: str, cdc_conn: Any, case: Case, rng: random.Random
) -> TableSplitResult:
    create_and_load(mariadb, db, "t", case.columns, case.rows, case.primary_key)
    schema = read_table_schema(cdc_conn, TableId(db, "t"))
    options = SplitOptions(
        case.chunk_size, None if case.primary_key else [n for n, _ in case.columns], **case.options
    )
    result = split_table(cdc_conn, schema, options, _COLLATIONS)
    label = f"{case.name} (seed {SEED}, chunk {case.chunk_size})"
    if case.method is not None:
        assert result.method == case.method, f"{label}: {result.method} split"

    placement = server_placement(cdc_conn, "t", result)
    n = len(placement.keys_of)
    if case.primary_key:
        assert len(set(placement.keys_of.values())) == n
    python_agrees(result, placement, label)
    order = KeyOrder(result.key_columns, result.collations)
    check_sizes(cdc_conn, result, placement, case.chunk_size, order)
    if n == 0:
        assert len(result.splits) == 1
    else:
        # neither one chunk for a big table nor absurdly fragmented
        assert len(result.splits) <= 3 * math.ceil(n / case.chunk_size) + 3, f"{label}: {len(result.splits)} chunks"
        if n > 4 * case.chunk_size:
            assert len(result.splits) > 2, f"{label}: {n} rows in {len(result.splits)} chunks"

    # Keys that are not in the table, as binlog events would bring them: same column types.
    stored = list(placement.keys_of.values())
    probes = probe_keys(result, stored, rng)
    create_and_load(mariadb, db, "probe", case.columns, probes, primary_key=False)
    python_agrees(result, server_placement(cdc_conn, "probe", result), f"{label} probes")
    return result


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize(("gen", "i"), CASES, ids=CASE_IDS)
def test_every_row_in_exactly_one_split(
    mariadb: MariaDBServer, db: str, cdc_conn: Any, gen: Callable[[random.Random], Case], i: int
) -> None:
    case = make_case(gen, i)
    split_and_verify(mariadb, db, cdc_conn, case, random.Random(f"{SEED}/probes/{case.name}/{i}"))


def test_generator_covers_enough_tables() -> None:
    assert len(CASES) >= 30
    names = {make_case(g, i).name for g, i in CASES}
    for coll in ("utf8mb4_general_ci", "utf8mb4_unicode_ci", "utf8mb4_bin", "utf8mb4_uca1400_ai_ci"):
        assert f"varchar_{coll}" in names


def _hot_rows(
    rng: random.Random, chunk: int, hot: Callable[[], Any], others: Callable[[], Any], n_hot: int
) -> list[tuple[Any]]:
    """``n_hot`` rows of one key value (> 2 x chunk) among 10-30 chunks of other values."""
    rows = [(hot(),) for _ in range(n_hot)]
    rows += [(others(),) for _ in range(rng.randint(10 * chunk, 30 * chunk))]
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("hot_key", [0, 500, 1000], ids=["hot-min", "hot-mid", "hot-max"])
@pytest.mark.parametrize("force_uneven", [False, True], ids=["even-path", "uneven-path"])
def test_non_unique_int_chunk_key_with_a_hot_value(
    mariadb: MariaDBServer, db: str, cdc_conn: Any, force_uneven: bool, hot_key: int
) -> None:
    rng = random.Random(f"{SEED}/hot-int/{force_uneven}/{hot_key}")
    chunk = 13
    cold = [k for k in range(1001) if k != hot_key]
    rows = _hot_rows(rng, chunk, lambda: hot_key, lambda: rng.choice(cold), n_hot=7 * chunk)
    case = Case(
        "hot_int", [("k", INT)], rows, chunk, "uneven" if force_uneven else "even", primary_key=False,
        options={"min_distribution_factor": 10.0**9} if force_uneven else {},
    )
    result = split_and_verify(mariadb, db, cdc_conn, case, rng)
    # the hot value's rows are all in one split, which holds nothing else
    hot = [s for s in result.splits if s.contains((hot_key,), KeyOrder(result.key_columns))]
    assert len(hot) == 1
    cond = split_condition(hot[0])
    assert query(cdc_conn, f"SELECT COUNT(*), MIN(k), MAX(k) FROM `{db}`.t WHERE {cond}") == [
        (7 * chunk, hot_key, hot_key)
    ]


@pytest.mark.parametrize(
    "forms",
    [["Hot", "HOT", "hot", "hot ", "hót", "HÓT  ", "hOt"], ["", " ", "   "]],
    ids=["case-accent-padding", "empty-and-spaces"],
)
def test_non_unique_varchar_chunk_key_equal_under_collation(
    mariadb: MariaDBServer, db: str, cdc_conn: Any, forms: list[str]
) -> None:
    """'Hot', 'HOT', 'hot ', 'hót' are one value under general_ci (as are '', ' ', '   '): all of
    them land in one split, which holds nothing else."""
    rng = random.Random(f"{SEED}/hot-varchar/{forms[0]}")
    chunk = 11
    rows = _hot_rows(rng, chunk, lambda: rng.choice(forms), lambda: rand_string(rng), n_hot=6 * chunk)
    case = Case("hot_varchar", [("s", varchar("utf8mb4_general_ci"))], rows, chunk, "uneven", primary_key=False)
    result = split_and_verify(mariadb, db, cdc_conn, case, rng)
    loc = ChunkLocator(result.splits, result.collations)
    homes = {loc.locate((f,)).split_id for f in forms}
    assert len(homes) == 1
    (home,) = homes
    cond = split_condition(result.splits[home], result.collations)

    def norm(v: str) -> str:  # general_ci equality, for the characters used here
        return v.rstrip(" ").lower().replace("ó", "o")

    in_split = Counter(norm(v) for (v,) in query(cdc_conn, f"SELECT s FROM `{db}`.t WHERE {cond}"))
    everywhere = Counter(norm(v) for (v,) in query(cdc_conn, f"SELECT s FROM `{db}`.t"))
    # every row equal to the hot value (6 x chunk, plus random ones that happen to equal it), nothing else
    assert in_split == {norm(forms[0]): everywhere[norm(forms[0])]}
    assert in_split[norm(forms[0])] >= 6 * chunk
