"""The history file itself, apart from what is in it: one chat at a time holds it (a lock beside
it), and a damaged one is named for what SQLite found and set aside with every byte kept."""

from __future__ import annotations

import time
from pathlib import Path


class HistoryError(RuntimeError):
    """The history database cannot be opened or is not a macbatch history."""


class CorruptHistory(HistoryError):
    """The history file is damaged; ``problem`` is what SQLite found."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"the chat history {path} is damaged ({problem}). Move the file away to start a "
            "fresh history (or point MACBATCH_HOME at another directory)."
        )
        self.path = path
        self.problem = problem


def aside_name(path: Path, now: float | None = None) -> Path:
    """Where a damaged history is kept: beside it, named for the moment it was set aside."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return path.with_name(f"{path.name}.damaged-{stamp}")


def set_aside(path: Path) -> Path:
    """Rename a damaged history (and SQLite's -wal / -shm files beside it) out of the way,
    keeping every byte; returns its new name."""
    target = aside_name(path)
    for suffix in ("-wal", "-shm", ""):
        part = path.with_name(path.name + suffix)
        if part.exists():
            part.rename(target.with_name(target.name + suffix))
    return target


class HistoryLock:
    """One ``macbatch chat`` per history: two would write into the same sessions interleaved.
    An exclusive lock on ``<history>.lock``, held until ``release`` (or the process ends)."""

    def __init__(self, path: Path) -> None:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.with_name(path.name + ".lock").open("w")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise HistoryError(
                f"another macbatch chat has the history {path} open; use that one, close it "
                "first, or give this one another file with --history"
            ) from None

    def release(self) -> None:
        self._file.close()
