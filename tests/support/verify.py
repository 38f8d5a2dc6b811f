"""Compare a sink table with its source table, row for row and value for value.

Used by the demo's verification table and by end-to-end tests. The source side is read with
pymysql through the same canonical SQL projection the snapshot uses (not through Spark), so a
JDBC-path bug cannot hide behind itself; both sides become Arrow tables of the canonical schema,
sorted by primary key, and are compared whole, plus an order-independent checksum for display.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_mysqlcdc.core import projection
from airflow_provider_mysqlcdc.core import types as cdc_types
from airflow_provider_mysqlcdc.core.table import TableSchema


@dataclass
class TableComparison:
    table: str
    source_rows: int
    sink_rows: int
    source_checksum: str
    sink_checksum: str
    first_difference: str | None = None

    @property
    def match(self) -> bool:
        return self.first_difference is None and self.source_checksum == self.sink_checksum


def source_table(conn: Any, schema: TableSchema) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(f"SELECT {projection.select_list(schema)} FROM {schema.table.quoted}")
        names = [d[0] for d in cur.description]
        target = cdc_types.arrow_schema(schema)
        # pymysql returns BIT(1) as bytes; the projection already made every other type canonical.
        bools = [n for n in names if pa.types.is_boolean(target.field(n).type)]
        rows = []
        for r in cur.fetchall():
            row = dict(zip(names, r, strict=True))
            for n in bools:
                if isinstance(row[n], bytes | bytearray):
                    row[n] = int.from_bytes(row[n], "big") != 0
            rows.append(row)
    return cdc_types.rows_to_arrow(rows, schema)


def _sorted(t: pa.Table, pk: list[str]) -> pa.Table:
    return t.sort_by([(c, "ascending") for c in pk]) if t.num_rows else t


def _checksum(t: pa.Table) -> str:
    h = hashlib.sha256()
    for batch in t.to_batches(max_chunksize=65536):
        for row in batch.to_pylist():
            h.update(repr(sorted(row.items())).encode())
    return h.hexdigest()[:16]


def compare(conn: Any, schema: TableSchema, sink_table: pa.Table) -> TableComparison:
    src = source_table(conn, schema)
    target = cdc_types.arrow_schema(schema)
    snk = sink_table.select(target.names).cast(target)
    pk = schema.primary_key or target.names
    src, snk = _sorted(src, pk), _sorted(snk, pk)
    diff = None
    if src.num_rows != snk.num_rows:
        diff = f"row count differs: source {src.num_rows}, sink {snk.num_rows}"
    elif not src.equals(snk):
        for name in target.names:
            eq = pc.equal(src.column(name), snk.column(name))
            both_null = pc.and_(pc.is_null(src.column(name)), pc.is_null(snk.column(name)))
            ok = pc.or_kleene(pc.fill_null(eq, False), both_null)
            bad = pc.index(ok, False).as_py()
            if bad is not None and bad >= 0:
                key = {c: src.column(c)[bad].as_py() for c in pk}
                diff = (
                    f"column {name} differs at {key}: source {src.column(name)[bad].as_py()!r}, "
                    f"sink {snk.column(name)[bad].as_py()!r}"
                )
                break
        diff = diff or "tables differ"
    return TableComparison(str(schema.table), src.num_rows, snk.num_rows, _checksum(src), _checksum(snk), diff)


def assert_sink_equals_source(settings: Any, sink: Any, table: str, source: str | None = None) -> None:
    """The Delta table of ``table`` equals the source table ``source`` (default: ``table``)."""
    from airflow_provider_mysqlcdc.core.table import TableId
    from airflow_provider_mysqlcdc.mysql.schema import read_table_schema

    with settings.connect() as conn:
        cmp = compare(conn, read_table_schema(conn, TableId.parse(source or table)), sink.read(table))
    assert cmp.match, (table, cmp)

