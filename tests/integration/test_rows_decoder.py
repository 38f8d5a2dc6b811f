"""The fast rows decoder (mysql/rows_decoder.py) against python-mysql-replication + the converter.

The type-fidelity matrix (every type, edge, zero and NULL values, written by hand from what MySQL
stores) is inserted, then every row is changed many times with seeded random values (updates,
key moves, deletes, multi-row statements, values > 64 KiB). The same binlog range is read twice
with ``BinlogRangeReader``: once with ``schemas=`` (the fast decoder) and once with ``convert=``
(the library and ``binlog_row_converter``). Every change must be identical — op, images, value
types, positions. The insert images must also equal the matrix's expected values.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_mysqlcdc.core.table import TableId
from airflow_provider_mysqlcdc.mysql import binlog_values
from airflow_provider_mysqlcdc.mysql.binlog_reader import BinlogRangeReader
from airflow_provider_mysqlcdc.mysql.rows_decoder import MISSING, RowsDecoder, UnsupportedRowFormat
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema
from airflow_provider_mysqlcdc.mysql.server import current_offset
from tests.integration.test_type_fidelity import DDL, ROWS, point

pytestmark = pytest.mark.integration

_ids = itertools.count(7600)  # distinct replication server_ids for this module's readers
# The matrix without its latin1 column: one column off the fast path sends the whole table map to
# the library (tested separately below).
FAST_DDL = DDL.replace(" c_latin1 VARCHAR(20) CHARACTER SET latin1,", "")


def _read(settings: Any, start: Any, end: Any, table: str, schema: Any, fast: bool, keys: Any = None) -> list[Any]:
    conv = binlog_values.binlog_row_converter(schema)
    kw: dict[str, Any] = {"convert": lambda t, v, ns: conv(v, ns)}  # fast: for a table map off the fast path
    if fast:
        kw |= {"schemas": {table: schema}, "key_columns": {table: keys} if keys else None}
    reader = BinlogRangeReader(settings, start, end, [table], next(_ids), **kw)
    with reader:
        out = [(c.op, c.table, c.before, c.after, c.tx_offset, c.event_pos, c.row_index, c.commit_ts) for c in reader]
    assert reader.reached_end
    return out


def _typed(rows: list[Any]) -> list[Any]:
    """Values with their types: True is not 1, Decimal('1.0') is not Decimal('1.00')."""

    def img(d: dict[str, Any] | None) -> Any:
        if d is None:
            return None
        return {k: (type(v).__name__, str(v) if isinstance(v, Decimal) else v) for k, v in d.items()}

    return [(op, t, img(b), img(a), *rest) for op, t, b, a, *rest in rows]


def _random_values(rng: random.Random) -> dict[str, Any]:
    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.1 else v

    def dec(int_digits: int, scale: int) -> str:
        sign = rng.choice(["", "-"])
        i = rng.randrange(10 ** rng.randint(0, int_digits))
        f = rng.randrange(10**scale) if scale else None
        return f"{sign}{i}" + (f".{f:0{scale}d}" if scale else "")

    def time(fsp: int) -> str:
        h, m, s = rng.randint(0, 838), rng.randint(0, 59), rng.randint(0, 59)
        if h == 838:
            m = s = 59
        txt = f"{rng.choice(['', '-'])}{h:02d}:{m:02d}:{s:02d}"
        if fsp and not (h == 838 and rng.random() < 2):  # 838:59:59 takes no fraction beyond .999..
            txt += "." + "".join(rng.choice("0123456789") for _ in range(fsp))
        return txt

    def datetime(fsp: int) -> str:
        d = dt.datetime(1000, 1, 1) + dt.timedelta(seconds=rng.randrange(9000 * 365 * 86400))
        txt = d.strftime("%Y-%m-%d %H:%M:%S")
        return txt + ("." + f"{rng.randrange(10**fsp):0{fsp}d}" if fsp else "")

    def text(n: int) -> str:
        alphabet = "abcXYZ é漢字😀 \t'\"\\"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, n)))

    ts = dt.datetime(1970, 1, 1, 0, 0, 1) + dt.timedelta(seconds=rng.randrange(2**31 - 2))
    return {
        "c_tinyint": maybe(rng.randint(-128, 127)), "c_tinyint1": maybe(rng.randint(-128, 127)),
        "c_tinyint_u": maybe(rng.randint(0, 255)), "c_smallint": maybe(rng.randint(-(2**15), 2**15 - 1)),
        "c_smallint_u": maybe(rng.randint(0, 2**16 - 1)), "c_mediumint": maybe(rng.randint(-(2**23), 2**23 - 1)),
        "c_mediumint_u": maybe(rng.randint(0, 2**24 - 1)), "c_int": maybe(rng.randint(-(2**31), 2**31 - 1)),
        "c_int_u": maybe(rng.randint(0, 2**32 - 1)), "c_bigint": maybe(rng.randint(-(2**63), 2**63 - 1)),
        "c_bigint_u": maybe(rng.randint(0, 2**64 - 1)), "c_dec": maybe(dec(8, 2)), "c_dec38": maybe(dec(28, 10)),
        "c_dec65": maybe(dec(35, 30)), "c_float": maybe(rng.uniform(-1e6, 1e6)),
        "c_double": maybe(rng.uniform(-1e300, 1e300)), "c_dt": maybe(datetime(0)), "c_dt6": maybe(datetime(6)),
        "c_ts": maybe(ts.strftime("%Y-%m-%d %H:%M:%S") + f".{rng.randrange(10**6):06d}"),
        "c_ts0": maybe(ts.strftime("%Y-%m-%d %H:%M:%S")), "c_date": maybe(datetime(0)[:10]),
        "c_time": maybe(time(0)), "c_time3": maybe(time(3)), "c_time6": maybe(time(6)),
        "c_year": maybe(rng.choice([0, 1901, 2155, rng.randint(1901, 2155)])), "c_char": maybe(text(10)),
        "c_varchar": maybe(text(50)), "c_text": maybe(text(300) * rng.choice([1, 1, 300])),
        "c_json": maybe(f'{{"k": "{rng.randrange(10**6)}", "emoji": "😀"}}'),
        "c_enum": maybe(rng.choice(["small", "medium", "large"])),
        "c_set": maybe(",".join(rng.sample(["red", "green", "blue"], rng.randint(0, 3)))),
        "c_set_nn": ",".join(rng.sample(["a", "b"], rng.randint(0, 2))), "c_bit1": maybe(rng.randint(0, 1)),
        "c_bit8": maybe(rng.randint(0, 255)), "c_bit64": maybe(rng.randint(0, 2**64 - 1)),
        "c_binary": maybe(bytes(rng.randrange(256) for _ in range(rng.randint(0, 4)))),
        "c_varbinary": maybe(bytes(rng.randrange(256) for _ in range(rng.randint(0, 16)))),
        "c_blob": maybe(bytes(rng.randrange(256) for _ in range(rng.choice([0, 10, 70_000])))),
        "c_geom": maybe(point(rng.uniform(-180, 180), rng.uniform(-90, 90), rng.choice([0, 4326]))),
    }  # fmt: skip


def test_fast_decoder_equals_the_library_for_every_type(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    table = f"{db}.t"
    mariadb.execute(FAST_DDL.format(t=f"`{db}`.t"))
    schema = read_table_schema(cdc_conn, TableId.parse(table))
    rng = random.Random(20261122)
    start = current_offset(cdc_conn)
    with mariadb.root_connection() as conn, conn.cursor() as cur:
        cur.execute("SET sql_mode = ''")
        for tz, given, _ in ROWS:
            cur.execute("SET time_zone = %s", (tz,))
            given = {k: v for k, v in given.items() if k != "c_latin1"}
            cols = list(given)
            cur.execute(f"INSERT INTO `{db}`.t ({', '.join(f'`{c}`' for c in cols)}) "
                        f"VALUES ({', '.join(['%s'] * len(cols))})", [given[c] for c in cols])  # fmt: skip
        conn.commit()
        cur.execute("SET time_zone = '+00:00'")
        ids = [r[1]["id"] for r in ROWS]
        for i in range(400):
            vals = _random_values(rng)
            choice = rng.random()
            if choice < 0.15:  # insert a new row
                new_id = 1000 + i
                vals["id"] = new_id
                ids.append(new_id)
                cols = list(vals)
                cur.execute(f"INSERT INTO `{db}`.t ({', '.join(f'`{c}`' for c in cols)}) "
                            f"VALUES ({', '.join(['%s'] * len(cols))})", [vals[c] for c in cols])  # fmt: skip
            elif choice < 0.2 and len(ids) > 3:  # delete
                victim = ids.pop(rng.randrange(len(ids)))
                cur.execute(f"DELETE FROM `{db}`.t WHERE id = %s", (victim,))
            elif choice < 0.25:  # key move
                old = ids.pop(rng.randrange(len(ids)))
                new = 100_000 + i
                ids.append(new)
                cur.execute(f"UPDATE `{db}`.t SET id = %s, rev = rev + 1 WHERE id = %s", (new, old))
            elif choice < 0.3:  # one statement, many rows (one rows event, several rows)
                cur.execute(f"UPDATE `{db}`.t SET rev = rev + 1, c_int = %s", (rng.randint(-5, 5),))
            else:
                target = rng.choice(ids)
                sets = ", ".join(f"`{c}` = %s" for c in vals)
                cur.execute(f"UPDATE `{db}`.t SET rev = rev + 1, {sets} WHERE id = %s", [*vals.values(), target])
            if i % 50 == 49:
                conn.commit()
        conn.commit()
    end = current_offset(cdc_conn)

    fast = _read(cdc_settings, start, end, table, schema, fast=True)
    slow = _read(cdc_settings, start, end, table, schema, fast=False)
    assert len(fast) > 500
    assert {op for op, *_ in fast} == {"c", "u", "d"}
    for f, s in zip(_typed(fast), _typed(slow), strict=True):
        assert f == s
    # and the inserts equal the hand-written expected values of the matrix
    expected = {g["id"]: e for _, g, e in ROWS}
    for op, _, _, after, *_ in fast[: len(ROWS)]:
        assert op == "c"
        want = {c.name: None for c in schema.columns} | {"id": after["id"], "rev": 0, "c_set_nn": ""}
        want |= expected[after["id"]]
        want.pop("c_latin1", None)
        assert _typed([("c", "", None, after)]) == _typed([("c", "", None, want)])

    # key-only before images: exactly the projection of the full ones
    keyed = _read(cdc_settings, start, end, table, schema, fast=True, keys=["id"])
    for k, f in zip(keyed, fast, strict=True):
        assert k[3] == f[3]
        assert k[2] == (None if f[2] is None else {"id": f[2]["id"]})


def test_a_table_off_the_fast_path_falls_back_to_the_library(mariadb, db, cdc_settings, cdc_conn, caplog) -> None:  # type: ignore[no-untyped-def]
    """A table map whose column differs from the schema (here a DOUBLE the table now logs as FLOAT)
    goes through python-mysql-replication; its text still decodes as the server does (koi8r and
    swe7, whose Python codecs differ or are missing, handed over as bytes)."""
    mariadb.execute(f"CREATE TABLE `{db}`.l (id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET koi8r, w DOUBLE, "
                    "s VARCHAR(20) CHARACTER SET swe7)")  # fmt: skip
    schema = read_table_schema(cdc_conn, TableId.parse(f"{db}.l"))
    mariadb.execute(f"ALTER TABLE `{db}`.l MODIFY w FLOAT")
    start = current_offset(cdc_conn)
    mariadb.execute(f"INSERT INTO `{db}`.l VALUES (1, 'привет', 1.5, CONVERT(x'5B5D7B' USING swe7)), "
                    "(2, NULL, -0.25, NULL)",
                    f"UPDATE `{db}`.l SET v = 'да', id = 3 WHERE id = 1")  # fmt: skip
    end = current_offset(cdc_conn)
    caplog.set_level("INFO", logger="airflow_provider_mysqlcdc.mysql.table_maps")
    fast = _read(cdc_settings, start, end, f"{db}.l", schema, fast=True)
    assert "decoding with python-mysql-replication" in caplog.text and "column w:" in caplog.text
    assert fast == _read(cdc_settings, start, end, f"{db}.l", schema, fast=False)
    swe7 = mariadb.query(f"SELECT s FROM `{db}`.l WHERE id = 3")[0][0]
    assert swe7 != "[]{"  # swe7 has letters where ASCII has brackets
    assert fast[-1][2:4] == ({"id": 1, "v": "привет", "w": 1.5, "s": swe7}, {"id": 3, "v": "да", "w": 1.5, "s": swe7})


def test_character_sets_and_members_equal_what_the_server_returns(mariadb, db, cdc_settings, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    """Where python-mysql-replication is wrong (big-endian utf16/utf32 read as little-endian, the
    five latin1 bytes cp1252 leaves undefined, latin1 ENUM/SET members it decodes as UTF-8), the
    fast path must give what the server itself returns. (MariaDB 10.11 cannot store a 4-byte
    character in an ENUM/SET member at all: it becomes '?' in the definition.)"""
    mariadb.execute(f"""CREATE TABLE `{db}`.cs (
        id INT PRIMARY KEY,
        u16 VARCHAR(20) CHARACTER SET utf16, u16le VARCHAR(20) CHARACTER SET utf16le,
        u32 VARCHAR(20) CHARACTER SET utf32, ucs VARCHAR(20) CHARACTER SET ucs2,
        l1 VARCHAR(20) CHARACTER SET latin1, l1text TEXT CHARACTER SET latin1, asc1 VARCHAR(20) CHARACTER SET ascii,
        l1enum ENUM('café', 'x') CHARACTER SET latin1, l1set SET('é', 'x') CHARACTER SET latin1,
        u8enum ENUM('漢字', 'a'), u8set SET('é', 'b', '漢'),
        c16 CHAR(5) CHARACTER SET utf16
    ) DEFAULT CHARSET=utf8mb4""")  # fmt: skip
    schema = read_table_schema(cdc_conn, TableId.parse(f"{db}.cs"))
    start = current_offset(cdc_conn)
    mariadb.execute(
        f"INSERT INTO `{db}`.cs VALUES (1, 'abc😀é', 'abc😀', 'z😀漢', 'ucs漢', 'café €', CONCAT('a', UNHEX('81'), "
        "UNHEX('8D8F909D'), 'ÿ'), 'plain', 'café', 'é,x', '漢字', '漢,é', 'ab')",
        f"INSERT INTO `{db}`.cs (id) VALUES (2)",
        f"UPDATE `{db}`.cs SET u16 = '', l1 = UNHEX('80'), u8set = 'b,漢', l1enum = 'x', id = 3 WHERE id = 1",
    )
    end = current_offset(cdc_conn)
    changes = _read(cdc_settings, start, end, f"{db}.cs", schema, fast=True)
    cols = [c.name for c in schema.columns]
    truth = {r[0]: dict(zip(cols, r, strict=True)) for r in mariadb.query(f"SELECT * FROM `{db}`.cs")}
    last = {}
    for _op, _, _, after, *_ in changes:
        if after is not None:
            last[after["id"]] = after
    assert set(last) == {1, 2, 3}
    assert last[3] == truth[3] and last[2] == truth[2]
    # UNHEX makes the CONCAT binary: the literal's UTF-8 bytes C3 BF land as two latin1 characters
    assert last[3]["l1text"] == "a\x81\x8d\x8f\x90\x9d\u00c3\u00bf" and last[3]["l1"] == "€"
    assert last[1]["u16"] == "abc😀é" and last[1]["u8set"] == "é,漢" and last[1]["l1enum"] == "café"


def test_decoder_refuses_what_it_cannot_decode_exactly(mariadb, db, cdc_conn) -> None:  # type: ignore[no-untyped-def]
    """A binlog column whose type differs from the schema (an ALTER not followed yet) is refused."""
    mariadb.execute(f"CREATE TABLE `{db}`.w (id INT PRIMARY KEY, n INT)")
    schema = read_table_schema(cdc_conn, TableId.parse(f"{db}.w"))

    class Col:
        def __init__(self, name: str, type_: int, unsigned: bool = False) -> None:
            self.name, self.type, self.unsigned = name, type_, unsigned

    from pymysqlreplication.constants import FIELD_TYPE

    RowsDecoder("w", [Col("id", FIELD_TYPE.LONG), Col("n", FIELD_TYPE.LONG)], schema)  # matches: fine
    with pytest.raises(UnsupportedRowFormat, match="integer"):
        RowsDecoder("w", [Col("id", FIELD_TYPE.LONG), Col("n", FIELD_TYPE.LONGLONG)], schema)  # widened
    # a column the image lacks (dropped by an ALTER the stream has not met yet) decodes as MISSING,
    # which no Arrow column accepts: the block is 'invalid' and the stream stops at the DDL
    lacking = RowsDecoder("w", [Col("id", FIELD_TYPE.LONG)], schema)
    assert lacking.missing == ["n"] and lacking.decode(b"\x00" + struct.pack("<i", 7), "c") == [{"id": 7, "n": MISSING}]
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        pa.array([MISSING], pa.int32())
    # an image written before RENAME COLUMN m TO n carries m: read as n
    cols = [Col("id", FIELD_TYPE.LONG), Col("m", FIELD_TYPE.LONG)]
    renamed = RowsDecoder("w", cols, schema, renamed_columns={"m": "n"})
    assert renamed.decode(b"\x00" + struct.pack("<ii", 7, 9), "c") == [{"id": 7, "n": 9}]
    dec = RowsDecoder("w", [Col("id", FIELD_TYPE.LONG)], schema, added_columns=["n"])  # added by the stream
    body = b"\x00" + struct.pack("<i", 7)
    assert dec.decode(body, "c") == [{"id": 7, "n": None}]
    # added with a DEFAULT: images older than the ADD COLUMN get the value the ALTER gave existing rows
    dflt = RowsDecoder("w", [Col("id", FIELD_TYPE.LONG)], schema, added_columns=["n"], added_defaults={"n": 5})
    assert dflt.decode(body, "c") == [{"id": 7, "n": 5}]
    assert dflt.decode(body + body, "u") == [({"id": 7, "n": 5}, {"id": 7, "n": 5})]
    # the compiled source is shared by decoders of the same shape (once per process); the values it
    # uses are each decoder's own
    other = RowsDecoder("w", [Col("id", FIELD_TYPE.LONG)], schema, added_columns=["n"], added_defaults={"n": 6})
    assert other._full.__code__ is dflt._full.__code__
    assert other.decode(body, "c") == [{"id": 7, "n": 6}] and dflt.decode(body, "c") == [{"id": 7, "n": 5}]
    full = RowsDecoder("w", [Col("id", FIELD_TYPE.LONG), Col("n", FIELD_TYPE.LONG)], schema, added_columns=["n"],
                       added_defaults={"n": 5})  # fmt: skip
    assert full.decode(b"\x02" + struct.pack("<i", 7), "c") == [{"id": 7, "n": None}]  # a newer image's NULL stays
    convert = binlog_values.binlog_row_converter(schema, ["n"], {"n": 5})  # the library's path, alike
    assert convert({"id": 7}) == {"id": 7, "n": 5} and convert({"id": 7, "n": None}) == {"id": 7, "n": None}
    with pytest.raises(ValueError, match="past the end"):
        dec.decode(body[:-1], "c")
