"""OpenLineage datasets of the snapshot and stream operators, named as the OpenLineage spec names them.

The OpenLineage provider is optional: its classes are imported only when lineage is asked for, and
without it there is no lineage (``None``), never an import error.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

Names = tuple[str, str]  # (namespace, name)


def source_dataset(host: str, port: int, table: str) -> Names:
    """A MySQL table: namespace ``mysql://host:port``, name ``db.table``."""
    return f"mysql://{host}:{int(port)}", table


def delta_dataset(sink_root: str, table: str) -> Names:
    """A Delta table ``<sink_root>/<db>/<table>``: namespace = scheme and authority, name = path.

    A plain path is ``file`` with the absolute path as name; an object store is e.g.
    ``s3://bucket`` with the key as name (no leading slash), as the OpenLineage naming spec says.
    """
    db, name = table.split(".", 1)
    uri = f"{str(sink_root).rstrip('/')}/{db}/{name}"
    parts = urlsplit(uri)
    if not parts.scheme or parts.scheme == "file" or len(parts.scheme) == 1:  # "C:/..." is a path too
        path = parts.path if parts.scheme == "file" else uri
        return "file", path
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def lineage_names(host: str, port: int, sink_root: str, tables: list[str]) -> tuple[list[Names], list[Names]]:
    """Inputs (the source tables) and outputs (their Delta tables), sorted by table."""
    ordered = sorted(set(tables))
    return [source_dataset(host, port, t) for t in ordered], [delta_dataset(sink_root, t) for t in ordered]


def operator_lineage(host: str, port: int, sink_root: str, tables: list[str]) -> Any:
    """An ``OperatorLineage`` of the tables, or ``None`` without the OpenLineage provider."""
    try:
        from airflow.providers.common.compat.openlineage.facet import Dataset
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None
    inputs, outputs = lineage_names(host, port, sink_root, tables)
    return OperatorLineage(
        inputs=[Dataset(namespace=ns, name=name) for ns, name in inputs],
        outputs=[Dataset(namespace=ns, name=name) for ns, name in outputs],
    )
