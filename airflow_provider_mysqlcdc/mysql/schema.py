"""Read a table's schema from the source server's information_schema."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_provider_mysqlcdc.core.table import ColumnInfo, SourceSchemaError, TableId, TableSchema
from airflow_provider_mysqlcdc.core.table_selection import CatalogTable

_COLUMNS_SQL = """
SELECT COLUMN_NAME, ORDINAL_POSITION, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, CHARACTER_SET_NAME,
       COLLATION_NAME, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_MAXIMUM_LENGTH
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION
"""

_PK_SQL = """
SELECT COLUMN_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX
"""


#: Server schemas no pattern selects (an exact name still can, and the source check then decides).
SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")

_CATALOG_SQL = f"""
SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES
WHERE TABLE_SCHEMA NOT IN ({", ".join(["%s"] * len(SYSTEM_SCHEMAS))})
ORDER BY TABLE_SCHEMA, TABLE_NAME
"""


def list_catalog(conn: Any) -> list[CatalogTable]:
    """Every table and view the CDC user can see, outside the system schemas, in one query (a plan
    resolves all its patterns against this one listing)."""
    with conn.cursor() as cur:
        cur.execute(_CATALOG_SQL, SYSTEM_SCHEMAS)
        rows = cur.fetchall()
    return [CatalogTable(str(TableId(db, name)), str(kind)) for db, name, kind in rows]


_ALL_COLUMNS_SQL = """
SELECT TABLE_NAME, COLUMN_NAME, ORDINAL_POSITION, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, CHARACTER_SET_NAME,
       COLLATION_NAME, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_MAXIMUM_LENGTH
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({names})
ORDER BY TABLE_NAME, ORDINAL_POSITION
"""

_ALL_PKS_SQL = """
SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({names}) AND INDEX_NAME = 'PRIMARY' ORDER BY TABLE_NAME, SEQ_IN_INDEX
"""

#: Tables per information_schema query of :func:`read_table_schemas` (keeps a statement small).
SCHEMAS_PER_QUERY = 500


def _column(r: tuple[Any, ...]) -> ColumnInfo:
    """A column from a row of ``information_schema.COLUMNS`` (from COLUMN_NAME on)."""
    return ColumnInfo(
        name=r[0],
        ordinal=int(r[1]),
        data_type=str(r[2]).lower(),
        column_type=str(r[3]),
        nullable=(r[4] == "YES"),
        charset=r[5],
        collation=r[6],
        numeric_precision=None if r[7] is None else int(r[7]),
        numeric_scale=None if r[8] is None else int(r[8]),
        datetime_precision=None if r[9] is None else int(r[9]),
        char_max_length=None if r[10] is None else int(r[10]),
    )


def read_table_schemas(conn: Any, tables: Iterable[TableId]) -> dict[TableId, TableSchema]:
    """Columns and primary keys of many tables in two ``information_schema`` queries per database
    (not two per table: a plan over hundreds of tables otherwise spends most of its time on round
    trips). A table the server does not show is left out; :func:`read_table_schema` says why."""
    by_db: dict[str, list[str]] = {}
    for t in dict.fromkeys(tables):
        by_db.setdefault(t.database, []).append(t.table)
    out: dict[TableId, TableSchema] = {}
    with conn.cursor() as cur:
        for db, names in by_db.items():
            for i in range(0, len(names), SCHEMAS_PER_QUERY):
                part = names[i : i + SCHEMAS_PER_QUERY]
                marks = ", ".join(["%s"] * len(part))
                cur.execute(_ALL_COLUMNS_SQL.format(names=marks), (db, *part))
                columns: dict[str, list[ColumnInfo]] = {}
                for r in cur.fetchall():
                    columns.setdefault(r[0], []).append(_column(r[1:]))
                cur.execute(_ALL_PKS_SQL.format(names=marks), (db, *part))
                pks: dict[str, list[str]] = {}
                for name, col in cur.fetchall():
                    pks.setdefault(name, []).append(col)
                # names come back as the server stores them: match them to the asked ones exactly
                for name in part:
                    if name in columns:
                        out[TableId(db, name)] = TableSchema(TableId(db, name), columns[name], pks.get(name, []))
    return out


def read_table_schema(conn: Any, table: TableId) -> TableSchema:
    """Columns and primary key of ``table``; :class:`SourceSchemaError` if it does not exist."""
    with conn.cursor() as cur:
        cur.execute(_COLUMNS_SQL, (table.database, table.table))
        rows = cur.fetchall()
        if not rows:
            cur.execute(
                "SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
                (table.database, table.table),
            )
            hit = cur.fetchone()
            if hit is None:
                raise SourceSchemaError(
                    f"table {table} does not exist (or the CDC user cannot see it): check the name, or "
                    f"GRANT SELECT ON {table.quoted} to the CDC user"
                )
        cols = [_column(r) for r in rows]
        cur.execute(_PK_SQL, (table.database, table.table))
        pk = [r[0] for r in cur.fetchall()]
    return TableSchema(table, cols, pk)


__all__ = ["read_table_schema", "read_table_schemas"]
