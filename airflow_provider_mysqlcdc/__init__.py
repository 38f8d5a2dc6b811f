"""Lock-free MySQL/MariaDB change data capture on Spark, orchestrated by Airflow, into Delta Lake."""

__version__ = "0.1.0"
