"""A random writer for end-to-end tests: inserts, updates, deletes and key moves on three tables.

The three table shapes are the ones CDC gets wrong most often: a BIGINT key (key moves across
chunk and split-group boundaries), a composite (VARCHAR, INT) key, and a VARCHAR key under a
case-insensitive collation (case-only key changes are the same row to the database).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

ROWS = 50_000


def numbers(n: int) -> str:
    """A derived table of ``seq`` 1..``n`` (``n`` <= 10**6) that MySQL and MariaDB both read (MariaDB's
    ``seq_1_to_n`` tables do not exist on MySQL, and recursive CTEs stop at 1000 rows by default)."""
    k = len(str(max(1, int(n) - 1)))  # decimal places enough for n - 1
    digits = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10)) + ")"
    places = ", ".join(f"{digits} AS p{i}" for i in range(k))
    value = " + ".join(f"p{i}.d * {10**i}" for i in range(k))
    return f"(SELECT seq FROM (SELECT {value} + 1 AS seq FROM {places}) AS n WHERE seq <= {int(n)})"


def make_tables(mariadb: Any, db: str, rows: int = ROWS) -> list[str]:
    """t_int (BIGINT key), t_comp (composite VARCHAR, INT key), t_ci (VARCHAR key, utf8mb4_general_ci);
    on MariaDB and MySQL alike."""
    seq = numbers(rows)
    mariadb.execute(
        f"CREATE TABLE `{db}`.t_int (id BIGINT NOT NULL PRIMARY KEY, v INT NOT NULL, note VARCHAR(40), "
        "amount DECIMAL(12,2), at DATETIME(6))",
        f"INSERT INTO `{db}`.t_int SELECT seq, seq, CONCAT('n', seq), seq / 100, "
        f"TIMESTAMP('2026-01-01') + INTERVAL seq SECOND FROM {seq} AS s",
        f"CREATE TABLE `{db}`.t_comp (region VARCHAR(8) NOT NULL, n INT NOT NULL, v INT, PRIMARY KEY (region, n))",
        f"INSERT INTO `{db}`.t_comp SELECT ELT(1 + seq % 3, 'eu', 'us', 'apac'), seq, seq FROM {seq} AS s",
        f"CREATE TABLE `{db}`.t_ci (k VARCHAR(24) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL "
        "PRIMARY KEY, v INT)",
        f"INSERT INTO `{db}`.t_ci SELECT CONCAT(IF(seq % 2, 'key', 'KEY'), LPAD(seq, 6, '0')), seq FROM {seq} AS s",
        database=db,
    )
    return [f"{db}.t_int", f"{db}.t_comp", f"{db}.t_ci"]


class RandomWriter(threading.Thread):
    """Random single-statement transactions on all three tables, including key moves."""

    def __init__(self, mariadb: Any, db: str, rate: float = 150.0, seed: int = 1, rows: int = ROWS):
        super().__init__(daemon=True)
        self.mariadb, self.db, self.rate, self.rows = mariadb, db, rate, rows
        self.rnd = random.Random(seed)
        self.stop_event = threading.Event()
        self.transactions = 0
        self.errors: list[str] = []

    def statement(self) -> str:
        r, db = self.rnd.random(), self.db
        k = self.rnd.randint(1, self.rows + 5_000)
        if r < 0.15:
            return f"INSERT IGNORE INTO `{db}`.t_int VALUES ({self.rows + k}, {k}, 'ins', 1.25, NOW(6))"
        if r < 0.35:
            return f"UPDATE `{db}`.t_int SET v = v + 1, note = 'upd', at = NOW(6) WHERE id = {k}"
        if r < 0.42:
            return f"DELETE FROM `{db}`.t_int WHERE id = {k}"
        if r < 0.50:  # key move, often across chunk and group boundaries
            return f"UPDATE IGNORE `{db}`.t_int SET id = {self.rnd.randint(1, 2 * self.rows)} WHERE id = {k}"
        if r < 0.60:
            return f"UPDATE `{db}`.t_comp SET v = v - 1 WHERE region = 'us' AND n = {k}"
        if r < 0.66:
            region = self.rnd.choice(["eu", "us", "apac", "af"])
            return f"UPDATE IGNORE `{db}`.t_comp SET region = '{region}' WHERE n = {k}"
        if r < 0.72:
            return f"INSERT IGNORE INTO `{db}`.t_comp VALUES ('eu', {self.rows + k}, 0)"
        if r < 0.76:
            return f"DELETE FROM `{db}`.t_comp WHERE n = {k}"
        if r < 0.86:
            return f"UPDATE `{db}`.t_ci SET v = v + 7 WHERE k = 'key{k:06d}'"
        if r < 0.92:  # case-only key change: the same row under utf8mb4_general_ci
            return f"UPDATE IGNORE `{db}`.t_ci SET k = UPPER(k) WHERE k = 'key{k:06d}'"
        if r < 0.96:
            return f"INSERT IGNORE INTO `{db}`.t_ci VALUES ('new{k:06d}', {k})"
        return f"DELETE FROM `{db}`.t_ci WHERE k = 'KEY{k:06d}'"

    def run(self) -> None:
        conn = self.mariadb.root_connection(self.db)
        cur = conn.cursor()
        t0 = time.monotonic()
        while not self.stop_event.is_set():
            try:
                cur.execute(self.statement())
            except Exception as exc:  # a failed statement changes nothing; keep writing
                self.errors.append(str(exc))
            self.transactions += 1
            delay = t0 + self.transactions / self.rate - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
        conn.close()

    @property
    def achieved_rate(self) -> float:
        return self.transactions
