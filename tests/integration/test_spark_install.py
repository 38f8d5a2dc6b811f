"""The installed pyspark must be whole: pyspark-client shares its directory (docs/architecture.md, "Pitfalls")."""

from __future__ import annotations

from importlib.metadata import version


def test_pyspark_python_matches_the_jvm_and_udfs_run(spark) -> None:  # type: ignore[no-untyped-def]
    import pyspark
    from pyspark.sql.functions import udf

    assert pyspark.__version__ == version("pyspark") == spark.version
    client = version("pyspark-client")
    assert client == pyspark.__version__, f"pyspark-client {client} would overwrite pyspark {pyspark.__version__}"

    @udf("long")
    def plus_one(x: int) -> int:
        return x + 1

    rows = spark.range(5).select(plus_one("id").alias("y")).collect()
    assert [r.y for r in rows] == [1, 2, 3, 4, 5]
