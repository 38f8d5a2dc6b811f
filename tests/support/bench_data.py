"""The fact-table shape both benchmarks load (bench/snapshot.py, bench/stream.py)."""

from __future__ import annotations

from tests.support.mariadb import MariaDBServer


def load_orders(server: MariaDBServer, rows: int, table: str = "orders") -> None:
    """``bench.<table>``: BIGINT PK, INT, VARCHAR(16), DECIMAL(12,2), DATETIME(6), VARCHAR(200) ~100 chars,
    TINYINT."""
    server.execute(
        "CREATE DATABASE IF NOT EXISTS bench",
        f"""CREATE TABLE bench.{table} (
            id BIGINT NOT NULL PRIMARY KEY,
            customer INT NOT NULL,
            code VARCHAR(16) NOT NULL,
            amount DECIMAL(12,2) NOT NULL,
            created DATETIME(6) NOT NULL,
            note VARCHAR(200),
            flag TINYINT NOT NULL
        ) ENGINE=InnoDB""",
    )
    step = 500_000
    for lo in range(1, rows + 1, step):
        hi = min(rows, lo + step - 1)
        server.execute(
            f"""INSERT INTO bench.{table}
            SELECT seq, seq % 100003, CONCAT('C', LPAD(seq % 999983, 10, '0')), (seq % 1000000) / 100,
                   TIMESTAMP('2026-01-01') + INTERVAL seq SECOND + INTERVAL (seq % 1000000) MICROSECOND,
                   RPAD(CONCAT('note ', seq, ' '), 100, 'abcdefghij'), seq % 3
            FROM seq_{lo}_to_{hi}""",
            database="bench",
        )
    server.execute(f"ANALYZE TABLE bench.{table}")
