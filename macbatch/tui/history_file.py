"""The history file itself, apart from what is in it: one chat at a time holds it (a lock beside
the file a ``--history`` link points to), a damaged one is named for what SQLite found and set
aside with every byte kept, and one another process has locked is said to be busy, by whom."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (named in sqlite3 from Python 3.11, untyped)
COMMAND_SHOWN = 60  # characters of a holder's command line


def history_path() -> Path:
    """The default history (``chat --history`` changes chat's): chat's and ask's, one file."""
    from macbatch.config import data_dir

    return data_dir() / "chat.sqlite3"


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


class HistoryBusy(HistoryError):
    """Another process holds a lock on the history file (a backup, ``sqlite3`` in a shell, a
    program mid-transaction): the history is sound, only busy. ``holder`` names the process
    when it can be found."""

    def __init__(self, path: Path) -> None:
        found = holders(path)
        self.path = path
        self.holder = f"another process ({'; '.join(found)})" if found else "another process"
        super().__init__(f"the chat history {path} is locked by {self.holder}")


def is_busy(error: sqlite3.Error) -> bool:
    """SQLite gave up waiting for another connection's lock (not damage, not a bug)."""
    return getattr(error, "sqlite_errorcode", None) in BUSY_CODES


def holders(path: Path) -> list[str]:
    """The other processes that have ``path`` open, as "pid N: command" (empty when none can be
    seen): /proc where there is one (Linux), else lsof (macOS)."""
    target = str(path.resolve())
    if Path("/proc/self/fd").is_dir():
        return [f"pid {pid}: {command}" for pid, command in _proc_holders(target)]
    lsof = shutil.which("lsof")
    if lsof is None:
        return []
    try:
        listed = subprocess.run(
            [lsof, "-F", "pc", "--", target], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found, pid = [], ""
    for line in listed.splitlines():
        if line.startswith("p"):
            pid = line[1:]
        elif line.startswith("c") and pid != str(os.getpid()):
            found.append(f"pid {pid}: {line[1:]}")
    return found


def _proc_holders(target: str) -> list[tuple[str, str]]:
    found = []
    for process in Path("/proc").iterdir():
        if not process.name.isdigit() or int(process.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (process / "fd").iterdir()):
                words = (process / "cmdline").read_bytes().split(b"\0")
                command = " ".join(w.decode(errors="replace") for w in words if w)
                found.append((process.name, command[:COMMAND_SHOWN]))
        except OSError:  # gone meanwhile, or not ours to look into
            continue
    return found


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
    An exclusive lock on ``<history>.lock`` beside the file itself (a ``--history`` link to it
    takes the same lock), held until ``release`` (or the process ends)."""

    def __init__(self, path: Path) -> None:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        real = path.resolve()
        self._file = real.with_name(real.name + ".lock").open("w")
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


class BusyGuard:
    """The history's SQLite connection, with a lock held by another process turned into
    ``HistoryBusy`` (after ``timeout`` seconds of waiting: the UI thread waits no longer) and
    the refused transaction rolled back, so an action either happens whole or not at all."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self._db = sqlite3.connect(path, timeout=timeout)

    def _guarded(self, call: Callable[..., T], *args: object) -> T:
        try:
            return call(*args)
        except sqlite3.OperationalError as error:
            if not is_busy(error):
                raise
            self._db.rollback()
            raise HistoryBusy(self.path) from error

    def execute(self, sql: str, parameters: tuple | list = ()) -> sqlite3.Cursor:
        return self._guarded(self._db.execute, sql, parameters)

    def executemany(self, sql: str, rows: list) -> sqlite3.Cursor:
        return self._guarded(self._db.executemany, sql, rows)

    def executescript(self, script: str) -> sqlite3.Cursor:
        return self._guarded(self._db.executescript, script)

    def commit(self) -> None:
        self._guarded(self._db.commit)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> BusyGuard:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if kind is None:
            self.commit()
        else:
            self._db.rollback()
