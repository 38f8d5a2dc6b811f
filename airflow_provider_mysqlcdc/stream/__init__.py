"""The binlog stream: the ``mysql_binlog`` Spark source, its manifest, and the job that applies it."""
