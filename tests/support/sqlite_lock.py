"""Another process holding a write lock on a SQLite file (``BEGIN EXCLUSIVE``), as a backup tool
or a second program left mid-transaction would: for the chat history's lock tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLD = (
    "import sqlite3, sys\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "db.execute('BEGIN EXCLUSIVE')\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"  # until the test closes our stdin
    "db.execute('COMMIT')\n"
)


@contextmanager
def exclusive_lock(path: Path) -> Iterator[int]:
    """Hold ``BEGIN EXCLUSIVE`` on ``path`` in a child process until the block ends; yields
    its pid. The lock is taken before this yields (the child says so), not after a delay."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        yield child.pid
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
