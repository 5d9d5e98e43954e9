"""The resume ledger: which requests are done, kept in SQLite (WAL) next to the output files.

A request is recorded only after its output line is on disk, so the ledger never claims more than
the files hold. The converse gap (a line written, the process killed before the commit) is closed
by `Ledger.recorded_size` and `outputs.recover`, which re-reads only the bytes written after the
last commit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS done (
    key TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    custom_id TEXT NOT NULL,
    sample INTEGER NOT NULL,
    correct INTEGER,
    grp TEXT,
    finished_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS done_slot ON done (job, custom_id, sample);
CREATE TABLE IF NOT EXISTS jobs (name TEXT PRIMARY KEY, settings TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (job TEXT PRIMARY KEY, size INTEGER NOT NULL);
"""
# Columns added since the first ledgers, each with its type: a ledger without one gets it (its
# old rows read NULL there: unknown).
ADDED_COLUMNS = {"done": {"model": "TEXT"}}  # the model that answered the row


@dataclass(frozen=True)
class DoneRecord:
    """One completed request, as the ledger stores it (also rebuilt from output lines)."""

    key: str
    job: str
    custom_id: str
    sample: int
    correct: bool | None
    group: str | None
    model: str | None = None  # the model that answered it (None: a ledger from before)


class Ledger:
    """Completed requests per job, the settings each job last ran with, and committed file sizes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self._add_columns()

    def _add_columns(self) -> None:
        for table, columns in ADDED_COLUMNS.items():
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns.items():
                if name not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self.db.close()

    def lookup(self, job: str, custom_id: str, sample: int) -> str | None:
        """The key recorded for this slot, or None if the slot is not done."""
        row = self.db.execute(
            "SELECT key FROM done WHERE job=? AND custom_id=? AND sample=?",
            (job, custom_id, sample),
        ).fetchone()
        return row[0] if row else None

    def record(self, done: DoneRecord, output_size: int) -> None:
        """Mark one request done and remember how many bytes of its output file are committed."""
        with self._transaction():
            self._insert([done])
            self._set_size(done.job, output_size)

    def adopt(self, job: str, records: Iterable[DoneRecord], output_size: int) -> int:
        """Record lines found in an output file but missing here; returns how many were new."""
        with self._transaction():
            before = self.count(job)
            self._insert(records)
            self._set_size(job, output_size)
            return self.count(job) - before

    def forget(self, job: str, *, settings: bool) -> None:
        """Drop the done records of `job` (its output is being rebuilt), and its settings too."""
        with self._transaction():
            self.db.execute("DELETE FROM done WHERE job=?", (job,))
            self.db.execute("DELETE FROM files WHERE job=?", (job,))
            if settings:
                self.db.execute("DELETE FROM jobs WHERE name=?", (job,))

    def count(self, job: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM done WHERE job=?", (job,)).fetchone()[0]

    def recorded_size(self, job: str) -> int:
        row = self.db.execute("SELECT size FROM files WHERE job=?", (job,)).fetchone()
        return row[0] if row else 0

    def settings(self, job: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT settings FROM jobs WHERE name=?", (job,)).fetchone()
        return json.loads(row[0]) if row else None

    def save_settings(self, job: str, settings: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO jobs (name, settings) VALUES (?, ?)",
            (job, json.dumps(settings, sort_keys=True)),
        )

    def models(self, job: str) -> dict[str | None, int]:
        """The models that answered the job's recorded rows, each with its count (None: rows
        recorded before the ledger kept models)."""
        rows = self.db.execute(
            "SELECT model, COUNT(*) FROM done WHERE job=? GROUP BY model", (job,)
        )
        return dict(rows.fetchall())

    def scores(self, job: str) -> list[tuple[str | None, int, int]]:
        """(group, scored, correct) per group of the job's scored requests."""
        return self.db.execute(
            "SELECT grp, COUNT(*), SUM(correct) FROM done "
            "WHERE job=? AND correct IS NOT NULL GROUP BY grp ORDER BY grp",
            (job,),
        ).fetchall()

    def _insert(self, records: Iterable[DoneRecord]) -> None:
        now = time.time()
        self.db.executemany(
            "INSERT OR IGNORE INTO done (key, job, custom_id, sample, correct, grp, finished_at, "
            "model) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (r.key, r.job, r.custom_id, r.sample, r.correct, r.group, now, r.model)
                for r in records
            ),
        )

    def _set_size(self, job: str, size: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO files (job, size) VALUES (?, ?)", (job, size))

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN ... COMMIT (ROLLBACK on error) on the autocommit connection."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
