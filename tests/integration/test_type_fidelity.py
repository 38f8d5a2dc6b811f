"""Type fidelity: every MySQL type reads the same through the snapshot path and the binlog path.

One table holds one column per type and rows with typical, edge, zero and NULL values. The same
rows are read

* **A (snapshot)**: Spark JDBC as the snapshot reads it (``snapshot.staging.jdbc_frame``: the
  ``jdbc_read`` projection + ``customSchema`` + its ``selectExpr``) -> Parquet (TIMESTAMP_MICROS)
  -> pyarrow, checked to already *have* ``arrow_schema`` (the Delta sink adopts Spark's files as
  they are, so a cast afterwards would hide a wrong type); the snapshot's native reader and whole
  snapshot groups run with ``reader='jdbc'`` are checked against the same values;
* **B (binlog)**: the INSERT and UPDATE row images decoded by python-mysql-replication ->
  ``binlog_row_converter`` -> ``rows_to_arrow``;

and both must equal the expected *typed* Python values (``True`` is not ``1``, ``Decimal`` is not
``int``). Both outputs also go through Delta (write, MERGE) and must come back unchanged.
The expected values are written out by hand from what MySQL stores, not derived from either path.
"""

from __future__ import annotations

import datetime as dt
import os
import struct
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.table import ColumnInfo, TableId, TableSchema
from airflow_provider_mysqlcdc.mysql import binlog_values
from airflow_provider_mysqlcdc.mysql import jdbc as mysql_jdbc
from airflow_provider_mysqlcdc.mysql.connection import ConnectionSettings
from airflow_provider_mysqlcdc.mysql.schema import read_table_schema

pytestmark = [pytest.mark.integration, pytest.mark.spark]

UTC = dt.UTC


def f32(x: float) -> float:
    """The float32 MySQL stores for ``x``, as a Python float (what both paths must return)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def point(x: float, y: float, srid: int = 0) -> bytes:
    """MySQL's internal geometry value: little-endian SRID, then WKB (1 = little endian, 1 = point)."""
    return struct.pack("<I", srid) + struct.pack("<BIdd", 1, 1, x, y)


def ts(*a: int) -> dt.datetime:
    return dt.datetime(*a, tzinfo=UTC)


DDL = """
CREATE TABLE {t} (
  id INT NOT NULL PRIMARY KEY,
  rev INT NOT NULL DEFAULT 0,
  c_tinyint TINYINT, c_tinyint1 TINYINT(1), c_tinyint_u TINYINT UNSIGNED,
  c_smallint SMALLINT, c_smallint_u SMALLINT UNSIGNED,
  c_mediumint MEDIUMINT, c_mediumint_u MEDIUMINT UNSIGNED,
  c_int INT, c_int_u INT UNSIGNED, c_bigint BIGINT, c_bigint_u BIGINT UNSIGNED,
  c_dec DECIMAL(10,2), c_dec38 DECIMAL(38,10), c_dec65 DECIMAL(65,30),
  c_float FLOAT, c_double DOUBLE, c_float_u FLOAT UNSIGNED,
  c_dt DATETIME, c_dt6 DATETIME(6), c_ts TIMESTAMP(6) NULL DEFAULT NULL, c_ts0 TIMESTAMP NULL DEFAULT NULL,
  c_dt1 DATETIME(1), c_dt2 DATETIME(2), c_dt3 DATETIME(3), c_dt4 DATETIME(4), c_dt5 DATETIME(5),
  c_ts3 TIMESTAMP(3) NULL DEFAULT NULL,
  c_date DATE, c_time TIME, c_time3 TIME(3), c_time6 TIME(6), c_year YEAR,
  c_char CHAR(10), c_varchar VARCHAR(50), c_text TEXT, c_latin1 VARCHAR(20) CHARACTER SET latin1,
  c_json JSON,
  c_enum ENUM('small','medium','large'), c_set SET('red','green','blue'),
  c_set_nn SET('a','b') NOT NULL DEFAULT '',
  c_bit1 BIT(1), c_bit8 BIT(8), c_bit64 BIT(64),
  c_binary BINARY(4), c_varbinary VARBINARY(16), c_blob BLOB,
  c_geom GEOMETRY
) DEFAULT CHARSET=utf8mb4
"""

# What goes in (text the server parses, in the session time zone given) and what must come out.
# Row 4 is all NULL; row 5 holds zero / partial-zero dates and an invalid ENUM value (sql_mode='').
# Inserted values: (column -> SQL parameter); expected: (column -> typed canonical value).
ROWS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "+05:30",
        dict(
            id=1, c_tinyint=7, c_tinyint1=2, c_tinyint_u=200, c_smallint=-1234, c_smallint_u=40000,
            c_mediumint=-100000, c_mediumint_u=9000000, c_int=123456789, c_int_u=3000000000,
            c_bigint=-1234567890123, c_bigint_u=12345678901234567890, c_dec="12345.67",
            c_dec38="1234567890123456789012345678.0123456789", c_dec65="3.14", c_float=1.1, c_double=2.2,
            c_dt="2024-02-29 13:14:15", c_dt6="2024-02-29 13:14:15.123456", c_ts="2024-01-01 05:30:00.250000",
            c_ts0="2024-06-01 12:00:00", c_date="2024-02-29", c_time="13:14:15", c_time3="01:02:03.4",
            c_time6="100:00:00.000001", c_year=2024, c_char="ab  ", c_varchar="trailing  ", c_text="x😀y",
            c_latin1="café €", c_json='{"name": "Zoë", "tags": ["a", "b"], "nested": {"x": [1, 2.5, null, true]}}',
            c_enum="medium", c_set="green", c_set_nn="b", c_bit1=1, c_bit8=0b10000001, c_bit64=1 << 63,
            c_binary=b"\x01\x02", c_varbinary=b"\x00\xff\x00", c_blob=bytes(range(256)), c_geom=point(1, 2, 4326),
        ),
        dict(
            id=1, rev=0, c_tinyint=7, c_tinyint1=2, c_tinyint_u=200, c_smallint=-1234, c_smallint_u=40000,
            c_mediumint=-100000, c_mediumint_u=9000000, c_int=123456789, c_int_u=3000000000,
            c_bigint=-1234567890123, c_bigint_u=Decimal("12345678901234567890"), c_dec=Decimal("12345.67"),
            c_dec38=Decimal("1234567890123456789012345678.0123456789"),
            c_dec65="3.140000000000000000000000000000", c_float=f32(1.1), c_double=2.2,
            c_dt=ts(2024, 2, 29, 13, 14, 15), c_dt6=ts(2024, 2, 29, 13, 14, 15, 123456),
            c_ts=ts(2024, 1, 1, 0, 0, 0, 250000), c_ts0=ts(2024, 6, 1, 6, 30), c_date=dt.date(2024, 2, 29),
            c_time="13:14:15", c_time3="01:02:03.400", c_time6="100:00:00.000001", c_year=2024,
            c_char="ab", c_varchar="trailing  ", c_text="x😀y", c_latin1="café €",
            c_json='{"name": "Zoë", "tags": ["a", "b"], "nested": {"x": [1, 2.5, null, true]}}',
            c_enum="medium", c_set="green", c_set_nn="b", c_bit1=True, c_bit8=129, c_bit64=Decimal(1 << 63),
            c_binary=b"\x01\x02\x00\x00", c_varbinary=b"\x00\xff\x00", c_blob=bytes(range(256)),
            c_geom=point(1, 2, 4326),
        ),
    ),
    (
        "+05:30",
        dict(
            id=2, c_tinyint=127, c_tinyint1=127, c_tinyint_u=255, c_smallint=32767, c_smallint_u=65535,
            c_mediumint=8388607, c_mediumint_u=16777215, c_int=2147483647, c_int_u=4294967295,
            c_bigint=9223372036854775807, c_bigint_u=18446744073709551615, c_dec="99999999.99",
            c_dec38="9999999999999999999999999999.9999999999",
            c_dec65="99999999999999999999999999999999999.999999999999999999999999999999",
            c_float=3.40282e38, c_double=1.7976931348623157e308, c_dt="9999-12-31 23:59:59",
            c_dt6="9999-12-31 23:59:59.999999", c_ts="2038-01-19 08:44:07.999999", c_ts0="2038-01-19 08:44:07",
            c_date="9999-12-31", c_time="838:59:59", c_time3="838:59:59.999", c_time6="838:59:59.999999",
            c_year=2155, c_char="é😀", c_varchar="😀" * 50, c_text="漢字 " * 1000, c_latin1="ÿ",
            c_json='{"emoji": "😀", "cjk": "漢字", "esc": "q\\" b\\\\ n\\n", "deep": [[[[{"a": {}}]]]], "n": -1.5e-7}',
            c_enum="large", c_set="blue,red,green", c_set_nn="a,b", c_bit1=1, c_bit8=255,
            c_bit64=0xFFFFFFFFFFFFFFFF, c_binary=b"\xff\xff\xff\xff", c_varbinary=b"\x00" * 16,
            c_blob=b"\x00" * 1000 + b"\x01", c_geom=point(-1.5, 1e300),
        ),
        dict(
            id=2, rev=0, c_tinyint=127, c_tinyint1=127, c_tinyint_u=255, c_smallint=32767, c_smallint_u=65535,
            c_mediumint=8388607, c_mediumint_u=16777215, c_int=2147483647, c_int_u=4294967295,
            c_bigint=9223372036854775807, c_bigint_u=Decimal("18446744073709551615"), c_dec=Decimal("99999999.99"),
            c_dec38=Decimal("9999999999999999999999999999.9999999999"),
            c_dec65="99999999999999999999999999999999999.999999999999999999999999999999",
            c_float=f32(3.40282e38), c_double=1.7976931348623157e308, c_dt=ts(9999, 12, 31, 23, 59, 59),
            c_dt6=ts(9999, 12, 31, 23, 59, 59, 999999), c_ts=ts(2038, 1, 19, 3, 14, 7, 999999),
            c_ts0=ts(2038, 1, 19, 3, 14, 7), c_date=dt.date(9999, 12, 31), c_time="838:59:59",
            c_time3="838:59:59.999", c_time6="838:59:59.999999", c_year=2155, c_char="é😀", c_varchar="😀" * 50,
            c_text="漢字 " * 1000, c_latin1="ÿ",
            c_json='{"emoji": "😀", "cjk": "漢字", "esc": "q\\" b\\\\ n\\n", "deep": [[[[{"a": {}}]]]], "n": -1.5e-7}',
            c_enum="large", c_set="red,green,blue", c_set_nn="a,b", c_bit1=True, c_bit8=255,
            c_bit64=Decimal(18446744073709551615), c_binary=b"\xff\xff\xff\xff", c_varbinary=b"\x00" * 16,
            c_blob=b"\x00" * 1000 + b"\x01", c_geom=point(-1.5, 1e300),
        ),
    ),
    (
        "+05:30",
        dict(
            id=3, c_tinyint=-128, c_tinyint1=-128, c_tinyint_u=0, c_smallint=-32768, c_smallint_u=0,
            c_mediumint=-8388608, c_mediumint_u=0, c_int=-2147483648, c_int_u=0,
            c_bigint=-9223372036854775808, c_bigint_u=0, c_dec="-99999999.99",
            c_dec38="-9999999999999999999999999999.9999999999",
            c_dec65="-99999999999999999999999999999999999.999999999999999999999999999999",
            c_float=-1.5, c_double=-0.0, c_dt="1000-01-01 00:00:00", c_dt6="1000-01-01 00:00:00.000001",
            c_ts="1970-01-01 05:30:01", c_ts0="1970-01-01 05:30:01", c_date="1000-01-01", c_time="-838:59:59",
            c_time3="-00:00:01.5", c_time6="-12:34:56.789012", c_year=1901, c_char="", c_varchar="",
            c_text="", c_latin1="", c_json="[]", c_enum="small", c_set="", c_set_nn="", c_bit1=0, c_bit8=0,
            c_bit64=0, c_binary=b"", c_varbinary=b"", c_blob=b"", c_geom=None,
        ),
        dict(
            id=3, rev=0, c_tinyint=-128, c_tinyint1=-128, c_tinyint_u=0, c_smallint=-32768, c_smallint_u=0,
            c_mediumint=-8388608, c_mediumint_u=0, c_int=-2147483648, c_int_u=0,
            c_bigint=-9223372036854775808, c_bigint_u=Decimal(0), c_dec=Decimal("-99999999.99"),
            c_dec38=Decimal("-9999999999999999999999999999.9999999999"),
            c_dec65="-99999999999999999999999999999999999.999999999999999999999999999999",
            # c_double: MariaDB stores -0.0 as 0.0 (the binlog image shows it)
            c_float=-1.5, c_double=0.0, c_dt=ts(1000, 1, 1), c_dt6=ts(1000, 1, 1, 0, 0, 0, 1),
            c_ts=ts(1970, 1, 1, 0, 0, 1), c_ts0=ts(1970, 1, 1, 0, 0, 1), c_date=dt.date(1000, 1, 1),
            c_time="-838:59:59", c_time3="-00:00:01.500", c_time6="-12:34:56.789012", c_year=1901,
            c_char="", c_varchar="", c_text="", c_latin1="", c_json="[]", c_enum="small", c_set="", c_set_nn="",
            c_bit1=False, c_bit8=0, c_bit64=Decimal(0), c_binary=b"\x00\x00\x00\x00", c_varbinary=b"",
            c_blob=b"", c_geom=None,
        ),
    ),
    ("+00:00", dict(id=4), {}),  # every other column NULL (c_set_nn NOT NULL: its default '')
    (
        "+05:30",
        dict(
            id=5, c_dt="0000-00-00 00:00:00", c_dt6="2024-00-15 10:00:00.5", c_ts="0000-00-00 00:00:00",
            c_ts0="0000-00-00 00:00:00", c_date="0000-00-00", c_time="00:00:00", c_time3="-00:00:00.001",
            c_time6="-00:00:00.000001", c_year=0, c_enum="not-a-member", c_set="green,red", c_bit64=1,
            c_dec="0", c_dec38="0", c_dec65="0", c_float=0.0, c_double=5e-324, c_json='"just a string"',
        ),
        dict(
            id=5, rev=0, c_dt=None, c_dt6=None, c_ts=None, c_ts0=None, c_date=None, c_time="00:00:00",
            c_time3="-00:00:00.001", c_time6="-00:00:00.000001", c_year=0, c_enum="", c_set="red,green",
            c_set_nn="", c_bit64=Decimal(1), c_dec=Decimal("0.00"), c_dec38=Decimal("0E-10"),
            c_dec65="0.000000000000000000000000000000", c_float=0.0, c_double=5e-324,
            c_json='"just a string"',
        ),
    ),
    (
        "-05:00",
        dict(
            id=6, c_dt="1582-10-15 00:00:00", c_dt6="2024-03-10 02:30:00.5", c_ts="2024-03-10 02:30:00.5",
            c_ts0="2024-11-03 01:30:00", c_date="1969-12-31", c_time6="-838:59:59.999999", c_time3="-23:59:59.999",
            c_time="-00:00:01",
        ),
        dict(
            id=6, rev=0, c_dt=ts(1582, 10, 15), c_dt6=ts(2024, 3, 10, 2, 30, 0, 500000),
            c_ts=ts(2024, 3, 10, 7, 30, 0, 500000), c_ts0=ts(2024, 11, 3, 6, 30), c_date=dt.date(1969, 12, 31),
            c_time6="-838:59:59.999999", c_time3="-23:59:59.999", c_time="-00:00:01", c_set_nn="",
        ),
    ),
]

# FLOAT values of 7-9 significant digits (the server prints FLOAT as text with 6): what goes in,
# and the float32 MySQL stores, written out (struct's rounding agrees: see test_float_table_is_float32).
FLOATS: list[tuple[float, float]] = [
    (16777216, 16777216.0), (-16777216, -16777216.0), (16777217, 16777216.0),
    (3.4028235e38, 3.4028234663852886e38), (-3.4028235e38, -3.4028234663852886e38),
    (1.1754944e-38, 1.1754943508222875e-38), (-1.1754944e-38, -1.1754943508222875e-38),
    (1234.567, 1234.5670166015625), (-1234.567, -1234.5670166015625), (123456789, 123456792.0),
    (0.1, 0.10000000149011612), (7654321.5, 7654321.5), (-8388607.5, -8388607.5),
    (1.4e-45, 1.401298464324817e-45), (99999.99, 99999.9921875), (-2.7182817, -2.7182817459106445),
]
FLOATS_UNSIGNED = [(given, want) for given, want in FLOATS if want > 0]

# Calendar edges: every day of 1582-10-04 .. 1582-10-16 (the ten days 05..14 do not exist in the
# Julian/Gregorian hybrid calendar java.sql.Date uses), the first and last day MySQL stores, and
# days where the Julian and the proleptic Gregorian calendars disagree about leap years.
CALENDAR_DAYS = [dt.date(1582, 10, d) for d in range(4, 17)] + [
    dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1, 12, 31), dt.date(4, 2, 29), dt.date(100, 2, 28),
    dt.date(100, 3, 1), dt.date(1500, 2, 28), dt.date(1500, 3, 1), dt.date(1582, 1, 1), dt.date(1582, 12, 31),
    dt.date(1899, 12, 31),
]


def _calendar_row(i: int, day: dt.date) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Row ``7 + i``: ``day`` in the DATE and every DATETIME(fsp) column, at the first or the last
    microsecond the precision can show; TIMESTAMPs at their own limits; FLOATs from the lists above."""
    late = i % 2 == 0
    hms, h = ("23:59:59", (23, 59, 59)) if late else ("00:00:00", (0, 0, 0))
    given: dict[str, Any] = dict(id=7 + i, c_date=day.isoformat(), c_dt=f"{day.isoformat()} {hms}")
    want: dict[str, Any] = dict(id=7 + i, c_date=day, c_dt=ts(day.year, day.month, day.day, *h))
    for fsp in range(1, 7):
        frac = "9" * fsp if late else "0" * (fsp - 1) + "1"
        given[f"c_dt{fsp}"] = f"{day.isoformat()} {hms}.{frac}"
        want[f"c_dt{fsp}"] = ts(day.year, day.month, day.day, *h, int(frac.ljust(6, "0")))
    if late:  # TIMESTAMP's range is 1970-01-01 00:00:01 .. 2038-01-19 03:14:07.999999 UTC
        given.update(c_ts="2038-01-19 03:14:07.999999", c_ts0="2038-01-19 03:14:07", c_ts3="2038-01-19 03:14:07.999")
        want.update(c_ts=ts(2038, 1, 19, 3, 14, 7, 999999), c_ts0=ts(2038, 1, 19, 3, 14, 7),
                    c_ts3=ts(2038, 1, 19, 3, 14, 7, 999000))
    else:
        given.update(c_ts="1970-01-01 00:00:01.000001", c_ts0="1970-01-01 00:00:01", c_ts3="1970-01-01 00:00:01")
        want.update(c_ts=ts(1970, 1, 1, 0, 0, 1, 1), c_ts0=ts(1970, 1, 1, 0, 0, 1), c_ts3=ts(1970, 1, 1, 0, 0, 1))
    given["c_float"], want["c_float"] = FLOATS[i % len(FLOATS)]
    given["c_float_u"], want["c_float_u"] = FLOATS_UNSIGNED[i % len(FLOATS_UNSIGNED)]
    return "+00:00", given, want


ROWS += [_calendar_row(i, day) for i, day in enumerate(CALENDAR_DAYS)]


def _columns(table_schema: TableSchema) -> list[str]:
    return [c.name for c in table_schema.columns]


def _expected_rows(table_schema: TableSchema) -> list[dict[str, Any]]:
    """Every column of every row: NULL unless the row says otherwise (c_set_nn defaults to '')."""
    out = []
    for _, given, exp in ROWS:
        row: dict[str, Any] = {c: None for c in _columns(table_schema)}
        row.update(id=given["id"], rev=0, c_set_nn="")
        row.update(exp)
        out.append(row)
    return out


# --------------------------------------------------------------------------- the two paths
class Matrix:
    def __init__(self, schema: TableSchema, snapshot: pa.Table, inserts: list[dict[str, Any]],
                 before: list[dict[str, Any]], after: list[dict[str, Any]], workdir: str):
        self.schema = schema
        self.snapshot = snapshot
        self.inserts = inserts
        self.before = before
        self.after = after
        self.workdir = workdir


def _insert_rows(mariadb: Any, table: str) -> None:
    with mariadb.root_connection() as conn, conn.cursor() as cur:
        cur.execute("SET sql_mode = ''")  # zero dates, partial dates and an invalid ENUM value go in
        for tz, given, _ in ROWS:
            cur.execute("SET time_zone = %s", (tz,))
            cols = list(given)
            cur.execute(
                f"INSERT INTO {table} ({', '.join(f'`{c}`' for c in cols)}) VALUES ({', '.join(['%s'] * len(cols))})",
                [given[c] for c in cols],
            )


def _read_binlog(settings: ConnectionSettings, start: tuple[str, int], db: str, table: str) -> list[Any]:
    reader = BinLogStreamReader(
        connection_settings=settings.replication_settings(),
        server_id=5000 + os.getpid() % 1000,
        log_file=start[0],
        log_pos=start[1],
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent],
        only_tables=[table],
        only_schemas=[db],
        is_mariadb=False,
    )
    try:
        return [(type(ev), row) for ev in reader for row in ev.rows]
    finally:
        reader.close()


def snapshot_read(spark: Any, settings: ConnectionSettings, schema: TableSchema, dest: str,
                  url: str | None = None) -> pa.Table:
    """Path A exactly as the snapshot job runs it: projection + customSchema -> Parquet -> Arrow."""
    from airflow_provider_mysqlcdc.snapshot.staging import jdbc_frame

    df = jdbc_frame(spark, url or mysql_jdbc.jdbc_url(settings), mysql_jdbc.jdbc_properties(settings), schema)
    df.coalesce(1).write.mode("overwrite").parquet(dest)
    return pq.read_table(dest).sort_by("id")


@pytest.fixture(scope="module")
def matrix(mariadb: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    db = "types_" + uuid.uuid4().hex[:8]
    table = f"`{db}`.`alltypes`"
    settings = mariadb.cdc_settings()
    mariadb.execute(f"CREATE DATABASE `{db}`", DDL.format(t=table))
    try:
        file, pos = mariadb.query("SHOW MASTER STATUS")[0][:2]
        _insert_rows(mariadb, table)
        mariadb.execute(f"UPDATE {table} SET rev = rev + 1")
        with settings.connect() as conn:
            schema = read_table_schema(conn, TableId(db, "alltypes"))
        work = str(tmp_path_factory.mktemp("types"))
        # The snapshot sees rev = 1; compare it with the UPDATE's after-images.
        snap = snapshot_read(spark, settings, schema, f"{work}/staged")
        conv = binlog_values.binlog_row_converter(schema)
        inserts, before, after = [], [], []
        for kind, row in _read_binlog(settings, (file, pos), db, "alltypes"):
            if kind is WriteRowsEvent:
                inserts.append(conv(row["values"], row["none_sources"]))
            else:
                before.append(conv(row["before_values"], row["before_none_sources"]))
                after.append(conv(row["after_values"], row["after_none_sources"]))
        yield Matrix(schema, snap, inserts, before, after, work)
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{db}`")


def _with_rev(rows: list[dict[str, Any]], rev: int) -> list[dict[str, Any]]:
    return [{**r, "rev": rev} for r in rows]


def _assert_rows_equal(got: list[dict[str, Any]], want: list[dict[str, Any]], label: str) -> None:
    """Typed equality, column by column, with one message listing every difference."""
    assert [r["id"] for r in got] == [r["id"] for r in want], f"{label}: row ids differ"
    problems = []
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w), f"{label}: columns differ: {sorted(set(g) ^ set(w))}"
        for col, wv in w.items():
            gv = g[col]
            same = type(gv) is type(wv) and gv == wv
            if same and isinstance(wv, float):  # 0.0 == -0.0: compare the bits
                same = struct.pack("<d", gv) == struct.pack("<d", wv)
            if not same:
                got_t, want_t = type(gv).__name__, type(wv).__name__
                problems.append(f"row {w['id']} {col}: got {gv!r:.120} ({got_t}), want {wv!r:.120} ({want_t})")
    assert not problems, f"{label}:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- the matrix
EXPECTED_ARROW = {
    "id": pa.int32(), "rev": pa.int32(), "c_tinyint": pa.int8(), "c_tinyint1": pa.int8(), "c_tinyint_u": pa.int16(),
    "c_smallint": pa.int16(), "c_smallint_u": pa.int32(), "c_mediumint": pa.int32(), "c_mediumint_u": pa.int32(),
    "c_int": pa.int32(), "c_int_u": pa.int64(), "c_bigint": pa.int64(), "c_bigint_u": pa.decimal128(20, 0),
    "c_dec": pa.decimal128(10, 2), "c_dec38": pa.decimal128(38, 10), "c_dec65": pa.string(),
    "c_float": pa.float32(), "c_double": pa.float64(), "c_float_u": pa.float32(), "c_dt": pa.timestamp("us", tz="UTC"),
    "c_dt6": pa.timestamp("us", tz="UTC"), "c_ts": pa.timestamp("us", tz="UTC"), "c_ts0": pa.timestamp("us", tz="UTC"),
    "c_date": pa.date32(), "c_time": pa.string(), "c_time3": pa.string(), "c_time6": pa.string(),
    "c_year": pa.int16(), "c_char": pa.string(), "c_varchar": pa.string(), "c_text": pa.string(),
    "c_latin1": pa.string(), "c_json": pa.string(), "c_enum": pa.string(), "c_set": pa.string(),
    "c_set_nn": pa.string(), "c_bit1": pa.bool_(), "c_bit8": pa.int64(), "c_bit64": pa.decimal128(20, 0),
    "c_binary": pa.binary(), "c_varbinary": pa.binary(), "c_blob": pa.binary(), "c_geom": pa.binary(),
    **{f"c_dt{fsp}": pa.timestamp("us", tz="UTC") for fsp in range(1, 6)}, "c_ts3": pa.timestamp("us", tz="UTC"),
}


def test_arrow_schema_is_the_canonical_mapping(matrix: Matrix) -> None:
    schema = cdc_types.arrow_schema(matrix.schema)
    assert {f.name: f.type for f in schema} == EXPECTED_ARROW
    assert all(f.nullable for f in schema)
    assert list(schema.names) == _columns(matrix.schema)


def test_snapshot_files_already_have_the_arrow_schema(matrix: Matrix) -> None:
    """The Delta sink adopts Spark's Parquet files unchanged: their types must be the canonical ones."""
    got = [(f.name, f.type) for f in matrix.snapshot.schema]
    want = [(f.name, f.type) for f in cdc_types.arrow_schema(matrix.schema)]
    assert got == want


def test_snapshot_path_values(matrix: Matrix) -> None:
    expected = _with_rev(_expected_rows(matrix.schema), 1)
    _assert_rows_equal(matrix.snapshot.to_pylist(), expected, "snapshot (Spark JDBC -> Parquet)")


def test_binlog_insert_images(matrix: Matrix) -> None:
    got = rows_via_arrow(matrix.inserts, matrix.schema)
    _assert_rows_equal(got, _with_rev(_expected_rows(matrix.schema), 0), "binlog INSERT images")


def test_binlog_update_images(matrix: Matrix) -> None:
    _assert_rows_equal(rows_via_arrow(matrix.before, matrix.schema), _with_rev(_expected_rows(matrix.schema), 0),
                       "binlog UPDATE before-images")
    _assert_rows_equal(rows_via_arrow(matrix.after, matrix.schema), _with_rev(_expected_rows(matrix.schema), 1),
                       "binlog UPDATE after-images")


def test_both_paths_agree(matrix: Matrix) -> None:
    """A == B directly, as Arrow tables (catches differences the per-value comparison could miss)."""
    b = cdc_types.rows_to_arrow(sorted(matrix.after, key=lambda r: r["id"]), matrix.schema)
    assert matrix.snapshot.cast(b.schema).equals(b)
    assert matrix.snapshot.to_pylist() == b.to_pylist()


def rows_via_arrow(rows: list[dict[str, Any]], schema: TableSchema) -> list[dict[str, Any]]:
    table = cdc_types.rows_to_arrow(sorted(rows, key=lambda r: r["id"]), schema)
    assert table.schema.equals(cdc_types.arrow_schema(schema))
    return table.to_pylist()


def test_delta_keeps_types_and_values(matrix: Matrix) -> None:
    """Snapshot rows written to Delta, binlog after-images MERGEd over them: types and values survive."""
    arrow = cdc_types.arrow_schema(matrix.schema)
    path = f"{matrix.workdir}/delta"
    write_deltalake(path, matrix.snapshot.cast(arrow), mode="overwrite")
    changes = cdc_types.rows_to_arrow(matrix.after, matrix.schema)
    (
        DeltaTable(path)
        .merge(changes, predicate="t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    table = DeltaTable(path)
    delta_schema = pa.schema(table.schema().to_arrow())
    assert {f.name: f.type for f in delta_schema} == {f.name: f.type for f in arrow}
    from deltalake import QueryBuilder  # to_pyarrow_table can abort the interpreter at exit (deltalake 1.6.6)

    got = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    got = got.cast(pa.schema(table.schema().to_arrow())).sort_by("id")
    assert {f.name: f.type for f in got.schema} == {f.name: f.type for f in arrow}
    assert table.version() == 1
    _assert_rows_equal(got.to_pylist(), _with_rev(_expected_rows(matrix.schema), 1), "Delta after MERGE")


def test_jdbc_path_does_not_depend_on_the_jvm_time_zone(matrix: Matrix, spark: Any, mariadb: Any) -> None:
    """Executors may run in any zone, with any driver datetime settings: temporal values travel as
    integers (days / microseconds since 1970), so nothing depends on them.

    Runs the snapshot read with the JVM default zone set to America/New_York (local mode: driver
    and executor share the JVM) over every value of the matrix, including wall times that do not
    exist in New York (2024-03-10 02:30, DST gap) and values before 1900 (Spark rebases
    ``java.sql`` values in the JVM zone: 1582-10-15 came out as 1582-10-04 23:56:02), then again
    with the legacy driver mode and the session in UTC-7. The control reads plain columns the way
    the projection avoids: the legacy mode shifts DATETIME by 5 hours and the driver's calendar
    moves 1582-10-05 ten days on.
    """
    settings = mariadb.cdc_settings()
    tz = spark._jvm.java.util.TimeZone
    saved = tz.getDefault()
    cols = ["id", "c_dt", "c_dt1", "c_dt2", "c_dt3", "c_dt4", "c_dt5", "c_dt6", "c_ts", "c_ts0", "c_ts3", "c_date"]
    want = [{c: r[c] for c in cols} for r in _with_rev(_expected_rows(matrix.schema), 1)]
    assert sum(v is not None and c != "id" for r in want for c, v in r.items()) >= 250
    url = mysql_jdbc.jdbc_url(settings)
    other_url = url.replace("useLegacyDatetimeCode=false", "useLegacyDatetimeCode=true").replace(
        "time_zone='+00:00'", "time_zone='-07:00'"
    )
    assert other_url != url
    try:
        tz.setDefault(tz.getTimeZone("America/New_York"))
        got = snapshot_read(spark, settings, matrix.schema, f"{matrix.workdir}/ny").select(cols).to_pylist()
        _assert_rows_equal(got, want, "snapshot on a New York JVM")
        got = snapshot_read(spark, settings, matrix.schema, f"{matrix.workdir}/ny-legacy", url=other_url)
        _assert_rows_equal(got.select(cols).to_pylist(), want, "snapshot on a New York JVM, legacy mode, UTC-7")

        plain = f"(SELECT id, c_dt, c_date FROM {matrix.schema.table.quoted} WHERE id IN (1, 8)) AS src"
        props = {**mysql_jdbc.jdbc_properties(settings), "customSchema": "id INT, c_dt TIMESTAMP, c_date DATE"}
        spark.read.jdbc(other_url, plain, properties=props).write.mode("overwrite").parquet(f"{matrix.workdir}/plain")
        control = pq.read_table(f"{matrix.workdir}/plain").sort_by("id").to_pylist()
        assert control[0]["c_dt"] == ts(2024, 2, 29, 18, 14, 15), "control: the legacy mode should shift DATETIME"
        assert control[1]["c_date"] == dt.date(1582, 10, 15), "control: java.sql.Date has no 1582-10-05"
    finally:
        tz.setDefault(saved)


# --------------------------------------------------------------------------- the native reader
def _without_geometry(schema: TableSchema) -> TableSchema:
    return TableSchema(schema.table, [c for c in schema.columns if c.name != "c_geom"], schema.primary_key)


def native_read(settings: ConnectionSettings, schema: TableSchema, dest: str) -> pa.Table:
    """The snapshot's native reader exactly as a Spark task runs it: one chunk -> Parquet -> Arrow."""
    from airflow_provider_mysqlcdc.snapshot.native_reader import stage_chunk

    staged = stage_chunk(settings, schema, 0, "1 = 1", dest, cdc_types.dictionary_columns(schema))
    path, rows = staged.path, staged.rows
    table = pq.read_table(path).sort_by("id")
    assert table.num_rows == rows
    return table


def test_native_reader_values_and_types(matrix: Matrix, mariadb: Any) -> None:
    """Every type (GEOMETRY aside: such tables use JDBC) through connectorx -> canonical Arrow ->
    Parquet: the file already has the canonical schema, and every value equals the expected one and
    the JDBC path's value."""
    schema = _without_geometry(matrix.schema)
    got = native_read(mariadb.cdc_settings(), schema, f"{matrix.workdir}/native")
    assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in cdc_types.arrow_schema(schema)]
    expected = [{k: v for k, v in r.items() if k != "c_geom"} for r in _with_rev(_expected_rows(matrix.schema), 1)]
    _assert_rows_equal(got.to_pylist(), expected, "snapshot (native reader -> Parquet)")
    assert got.equals(matrix.snapshot.drop_columns(["c_geom"]))


def test_native_reader_timestamp_does_not_depend_on_the_server_time_zone(matrix: Matrix, mariadb: Any) -> None:
    """connectorx cannot set a session time zone, so its sessions run in the server's global one:
    TIMESTAMP must still come out as its stored UTC instant (read as epoch microseconds)."""
    schema = _without_geometry(matrix.schema)
    cols = ["id", "c_dt", "c_dt6", "c_ts", "c_ts0", "c_date"]
    mariadb.execute("SET GLOBAL time_zone = '-07:00'")
    try:
        got = native_read(mariadb.cdc_settings(), schema, f"{matrix.workdir}/native-tz").select(cols).to_pylist()
    finally:
        mariadb.execute("SET GLOBAL time_zone = SYSTEM")
    want = [{c: r[c] for c in cols} for r in _expected_rows(matrix.schema)]
    _assert_rows_equal(got, [{**w} for w in want], "native reader with the server in UTC-7")


def test_native_reader_refuses_geometry_and_tls(matrix: Matrix, mariadb: Any) -> None:
    from airflow_provider_mysqlcdc.snapshot.native_reader import native_reader_unavailable

    settings = mariadb.cdc_settings()
    assert "c_geom" in (native_reader_unavailable(settings, matrix.schema) or "")
    schema = _without_geometry(matrix.schema)
    assert native_reader_unavailable(settings, schema) is None
    tls = ConnectionSettings(**{**settings.__dict__, "ssl": True})
    assert "TLS" in (native_reader_unavailable(tls, schema) or "")


# --------------------------------------------------------------------------- whole snapshot groups
def _snapshot_with(
    spark: Any, reader: str, settings: ConnectionSettings, table: str, chunk_size: int, workdir: str,
    chunk_key: list[str] | None = None,
) -> pa.Table:
    """Plan ``table`` in chunks and run every chunk group with ``reader``: what lands in Delta.

    Each chunk must have staged exactly the rows its key range holds on the server (counted there
    with the same predicate over the plain table)."""
    from airflow_provider_mysqlcdc.core.predicate import split_condition
    from airflow_provider_mysqlcdc.mysql.planner import plan_snapshot
    from airflow_provider_mysqlcdc.sinks.delta import DeltaSink
    from airflow_provider_mysqlcdc.snapshot.group import SnapshotOptions, run_snapshot_group
    from airflow_provider_mysqlcdc.state import StateStore

    store = StateStore(f"{workdir}/state", "pipe")
    sink = DeltaSink(f"{workdir}/lake")
    with settings.connect() as conn:
        plan = plan_snapshot(conn, [table], chunk_size, 3, {table: chunk_key} if chunk_key else None)
        quoted = plan.tables[table].table.quoted
        want = {}
        for split in plan.splits:
            with conn.cursor() as cur:
                cur.execute(f"SELECT COUNT(*) FROM {quoted} WHERE {split_condition(split, plan.collations)}")
                want[split.split_id] = cur.fetchone()[0]
    store.write_plan("p1", plan.to_dict())
    assert len(plan.splits) > 3  # several chunks, so the reader runs with its chunk predicates
    got = {}
    for g in plan.groups:
        res = run_snapshot_group(spark, settings, store, "p1", g.group_id, sink, SnapshotOptions(reader=reader))
        got.update({c.split_id: c.rows for c in res.chunks})
    assert got == want, "rows per chunk"
    return sink.read(table)


def test_snapshot_group_with_the_jdbc_reader(matrix: Matrix, mariadb: Any, spark: Any) -> None:
    """The whole matrix through ``run_snapshot_group(reader='jdbc')`` (``_stage_with_jdbc``, chunk
    predicates, staged files adopted by the Delta sink): every value equals the expected one."""
    settings = mariadb.cdc_settings()
    got = _snapshot_with(spark, "jdbc", settings, str(matrix.schema.table), 6, f"{matrix.workdir}/group")
    arrow = cdc_types.arrow_schema(matrix.schema)
    got = got.select(arrow.names).cast(arrow).sort_by("id")
    _assert_rows_equal(got.to_pylist(), _with_rev(_expected_rows(matrix.schema), 1), "snapshot group, reader='jdbc'")


KEYED_DDL = """
CREATE TABLE {t} (
  d DATE NOT NULL, k DATETIME(6) NOT NULL, f FLOAT NOT NULL, v INT,
  PRIMARY KEY (d, k), UNIQUE KEY (f)
)
"""


@pytest.mark.parametrize("reader", ["jdbc", "native"])
@pytest.mark.parametrize("chunk_key", [None, ["f"]], ids=["key-date-datetime", "key-float"])
def test_calendar_and_float_chunk_keys(
    reader: str, chunk_key: list[str] | None, mariadb: Any, db: str, spark: Any, tmp_path: Any
) -> None:
    """Chunk keys of DATE, DATETIME and FLOAT columns across the 1582 gap: every row is read once,
    by the chunk its key falls in, with its exact value (the chunk predicates compare the stored
    values, whatever form the reader's projection sends them in)."""
    t = f"`{db}`.keyed"
    start = dt.datetime(1582, 10, 1)
    rows = []
    for i in range(60):
        k = start + dt.timedelta(hours=7 * i, microseconds=i)
        rows.append((k.date(), k, f32((i - 30) * 1234.567 + 0.1), i))  # 7-9 significant digits
    mariadb.execute(KEYED_DDL.format(t=t))
    with mariadb.root_connection() as conn, conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {t} VALUES (%s, %s, %s, %s)", [(d, k.isoformat(" "), f, v) for d, k, f, v in rows]
        )
        conn.commit()
    settings = mariadb.cdc_settings()
    got = _snapshot_with(spark, reader, settings, f"{db}.keyed", 7, str(tmp_path), chunk_key)
    got = got.select(["d", "k", "f", "v"]).sort_by("v").to_pylist()
    want = [dict(d=d, k=k.replace(tzinfo=UTC), f=f, v=v) for d, k, f, v in rows]
    _assert_rows_equal([{"id": r["v"], **r} for r in got], [{"id": r["v"], **r} for r in want], f"reader={reader}")


def test_float_table_is_float32() -> None:
    """The hand-written float32 values above are what rounding to float32 gives."""
    for given, want in FLOATS:
        assert f32(given) == want, given


# --------------------------------------------------------------------------- without a server
def _col(name: str, data_type: str, column_type: str, **kw: Any) -> ColumnInfo:
    return ColumnInfo(name=name, ordinal=1, data_type=data_type, column_type=column_type, nullable=True, **kw)


def test_negative_time_repair_matches_the_server_encoding() -> None:
    """mysql-replication 1.0.17 decodes -16:08:04.250 (bytes 7E FD FB FC 2F 70) as -16:08:04.750."""
    t6 = binlog_values.binlog_converter(cdc_types.column_type(_col("t", "time", "time(6)", datetime_precision=6)))
    if binlog_values._binlog_misdecodes_negative_time():
        assert t6(-dt.timedelta(hours=16, minutes=8, seconds=4, microseconds=750000)) == "-16:08:04.250000"
    assert t6(-dt.timedelta(hours=838, minutes=59, seconds=59)) == "-838:59:59.000000"
    assert t6(dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=1)) == "838:59:59.000001"
    assert binlog_values.format_time(dt.timedelta(seconds=-1), 0) == "-00:00:01"


def test_set_enum_and_bit_accept_every_decoder_shape() -> None:
    conv = binlog_values.binlog_converter
    s = conv(cdc_types.column_type(_col("s", "set", "set('red','green','blue')")))
    assert s({"blue", "red"}) == "red,blue"
    assert s(0b101) == "red,blue"
    assert s(None, "empty set") == ""
    assert s(None, "null") is None
    assert s(None) is None  # nullable, no none_sources: NULL (documented ambiguity)
    s_nn = conv(cdc_types.column_type(ColumnInfo("s", 1, "set", "set('a')", nullable=False)))
    assert s_nn(None) == ""
    e = conv(cdc_types.column_type(_col("e", "enum", "enum('a','b')")))
    assert (e("b"), e(2), e(0)) == ("b", "b", "")
    b = conv(cdc_types.column_type(_col("b", "bit", "bit(64)")))
    assert b("1" * 64) == Decimal(2**64 - 1)
    assert binlog_values.binlog_converter(cdc_types.column_type(_col("b", "bit", "bit(1)")))("0") is False


def test_unsupported_type_is_a_clear_error() -> None:
    with pytest.raises(cdc_types.UnsupportedColumnType, match=r"column 'u' has type uuid.*docs/types.md"):
        cdc_types.column_type(_col("u", "uuid", "uuid"))


def test_missing_binlog_column_is_a_clear_error() -> None:
    schema = TableSchema(TableId("d", "t"), [_col("a", "int", "int"), _col("b", "int", "int")], ["a"])
    conv = binlog_values.binlog_row_converter(schema)
    assert conv({"a": 1, "b": None}) == {"a": 1, "b": None}
    with pytest.raises(ValueError, match=r"lacks columns \['b'\].*binlog_row_image=FULL"):
        conv({"a": 1})


def test_jdbc_url_and_properties() -> None:
    s = ConnectionSettings(host="db.example", port=3307, user="u", password="p@ss", ssl=False)
    url = mysql_jdbc.jdbc_url(s, "shop")
    assert url.startswith("jdbc:mysql://db.example:3307/shop?")
    for opt in ("sessionVariables=time_zone='+00:00'", "tinyInt1isBit=false", "yearIsDateType=false",
                "useLegacyDatetimeCode=false", "serverTimezone=UTC"):
        assert opt in url
    assert "p@ss" not in url and "useSsl" not in url
    assert mysql_jdbc.jdbc_properties(s)["driver"] == "org.mariadb.jdbc.Driver"
    assert "useSsl=true" in mysql_jdbc.jdbc_url(ConnectionSettings(ssl=True))
