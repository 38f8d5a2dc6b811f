"""Filtered reads of a Delta table through delta-rs' pyarrow dataset, checked against a full read.

Run as ``python -m tests.support.delta_reads URI``: it prints ``{"checked": n, "mismatches": [...],
"failed": [...]}`` (failed: filters pyarrow could not run, e.g. on the string_view files delta-rs'
own MERGE writes, which pyarrow 26 cannot compare with the table's string type).
A child process, because deltalake 1.6.6's pyarrow filesystem handler aborts the interpreter at
exit now and then, which must not end a test run (the printed result is read either way).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable, QueryBuilder


def mismatches(uri: str) -> dict[str, Any]:
    """Every column: equality filters on its first, middle and last value, and a range filter from
    its middle value, through ``to_pyarrow_dataset`` — each must select the rows a full read does."""
    dt = DeltaTable(uri)
    full = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    schema = pa.schema(dt.schema().to_arrow())
    full = full.select(schema.names).cast(schema)
    dataset = dt.to_pyarrow_dataset()
    out, failed, checked = [], [], 0
    for name in full.column_names:
        col = full.column(name)
        vals = col.drop_null()
        if not len(vals):
            continue
        for v in {vals[0], vals[len(vals) // 2], vals[len(vals) - 1]}:
            w = pa.scalar(v.as_py(), dataset.schema.field(name).type)  # the dataset's type (string_view)
            for label, want, flt in (
                ("==", pc.equal(col, v), ds.field(name) == w),
                (">=", pc.greater_equal(col, v), ds.field(name) >= w),
            ):
                expect = full.filter(want).num_rows
                try:
                    got = dataset.to_table(filter=flt).num_rows
                except pa.ArrowNotImplementedError as exc:
                    failed.append(f"{name} {label}: {exc}")
                    continue
                checked += 1
                if got != expect:
                    out.append(f"{name} {label} {v.as_py()!r}: {got} rows, a full read has {expect}")
    return {"checked": checked, "mismatches": out, "failed": failed}


if __name__ == "__main__":
    print(json.dumps(mismatches(sys.argv[1]), default=str), flush=True)
