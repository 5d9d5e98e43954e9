"""Chat history in SQLite, so every session survives a restart (and a crash mid-reply).

One file (``chat.sqlite3`` in the data directory) with five tables: sessions (title, whether the
user chose it, and its settings as one JSON column, so a new setting needs no migration),
messages (role, text, status, reply metrics, a thinking model's reasoning with its tokens and
seconds, and which version of a regenerated reply is shown), versions (a regenerated reply's
other versions, kept to flip back to), attachments (a message's images, their bytes: see
``tui/attachments.py``) and app_state (which chat was open last). The UI thread is the only
user; every write commits at once, so a crash loses at most the last streamed tokens.

Another process may lock the file (``BEGIN EXCLUSIVE`` in a shell, a backup): an action is then
refused with ``HistoryBusy`` (nothing half done, the caller keeps what the user typed), and the
saves that only bring a row up to date (a reply as it streams, app state) are kept and written
with the next write that gets through (``flush``): a lock never loses a reply.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from macbatch.session_settings import SessionSettings
from macbatch.tui.attachments import Attachment
from macbatch.tui.history_file import BusyGuard, CorruptHistory, HistoryBusy, HistoryError, is_busy

SESSIONS = """
CREATE TABLE IF NOT EXISTS {name} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    named INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    settings TEXT NOT NULL CHECK (json_valid(settings))
);
"""
SCHEMA = (
    SESSIONS.format(name="sessions")
    + """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'done',
    error TEXT,
    tokens INTEGER,
    ttft_s REAL,
    tokens_per_s REAL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_session ON messages(session_id, id);
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    tokens INTEGER,
    ttft_s REAL,
    tokens_per_s REAL,
    reasoning TEXT,
    reasoning_tokens INTEGER,
    reasoning_s REAL,
    UNIQUE (message_id, number)
);
CREATE TABLE IF NOT EXISTS app_state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
)

# Message columns added since the first release: every history gains them on open.
ADDED_COLUMNS = (
    ("reasoning", "TEXT"),
    ("reasoning_tokens", "INTEGER"),
    ("reasoning_s", "REAL"),
    ("version", "INTEGER NOT NULL DEFAULT 1"),  # of a regenerated reply, the one shown
)
# Session columns added since: a chat's model (NULL in older histories: the model chat starts
# with, as those chats had).
SESSION_ADDED_COLUMNS = (("model", "TEXT"),)
# What a version holds of a reply: the columns a regenerate starts again and a flip swaps.
VERSION_FIELDS = (
    "content",
    "status",
    "error",
    "tokens",
    "ttft_s",
    "tokens_per_s",
    "reasoning",
    "reasoning_tokens",
    "reasoning_s",
)
VERSION_COLUMNS = ", ".join(VERSION_FIELDS)

# How long the UI thread waits for another process's lock on the history before an action is
# refused (HistoryBusy) or a save is kept for later; at close, what is still kept waits longer.
BUSY_WAIT_S = 1.0
CLOSE_WAIT_MS = 10_000

# Message status values. A reply is "streaming" while the engine produces it; the others are final.
DONE = "done"
STREAMING = "streaming"
STOPPED = "stopped"
INTERRUPTED = "interrupted"
ERROR = "error"


@dataclass
class Session:
    id: int
    title: str
    settings: SessionSettings
    created: float
    named: bool = False  # the user chose the title; otherwise the first message gives one
    model: str | None = None  # the model it runs on (None: the one chat was started with)


@dataclass
class ReplyMetrics:
    """The numbers shown under a reply."""

    tokens: int
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    # speculative decoding, while the app runs (not stored): drafts accepted, and tokens per
    # verification (None: the reply did not speculate)
    acceptance_rate: float | None = None
    accepted_length: float | None = None
    # the prompt, and how much of it the prefix cache held, while the app runs (not stored)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    disk_cached_tokens: int | None = None  # of cached_tokens, read back from the disk tier


@dataclass
class Reasoning:
    """A reply's reasoning block, kept to show again (never sent back to the model)."""

    text: str
    tokens: int
    seconds: float | None = None


@dataclass
class Message:
    id: int
    session_id: int
    role: str
    content: str
    status: str = DONE
    error: str | None = None
    metrics: ReplyMetrics | None = field(default=None)
    reasoning: Reasoning | None = None
    images: list[Attachment] = field(default_factory=list)
    version: int = 1  # a regenerated reply's: which one is shown (and sent as context) ...
    versions: int = 1  # ... of how many


class HistoryStore:
    """Sessions and messages on disk. Opening it marks replies left streaming as interrupted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # what a lock held back: one write per row, the latest wins (flush writes them)
        self._kept: dict[tuple[str, object], Callable[[], object]] = {}
        self._db = BusyGuard(path, BUSY_WAIT_S)
        try:
            self._check_intact()
            self._move_settings_to_json()  # before foreign keys are on: it rebuilds sessions
            self._db.executescript(SCHEMA)
            self._add_missing_columns()
            self._db.execute("PRAGMA foreign_keys = ON")
            # A reply still "streaming" on disk belongs to a run that ended without saying so.
            self._db.execute(
                "UPDATE messages SET status = ? WHERE status = ?", (INTERRUPTED, STREAMING)
            )
            self._db.commit()
        except (CorruptHistory, HistoryBusy):
            self._db.close()
            raise
        except sqlite3.DatabaseError as error:
            self._db.close()
            if is_busy(error):
                raise HistoryBusy(path) from error
            if type(error) is sqlite3.DatabaseError:  # not a database, or a malformed one
                raise CorruptHistory(path, str(error)) from error
            raise HistoryError(
                f"cannot open the chat history {path}: {error}. Move the file away to start a "
                "fresh history (or point MACBATCH_HOME at another directory)."
            ) from error

    def _check_intact(self) -> None:
        """``CorruptHistory`` unless SQLite finds every page sound. Random bytes over a page
        otherwise surface later, as a traceback from the first query that reads it."""
        rows = self._db.execute("PRAGMA quick_check").fetchall()
        problems = [
            "; ".join(line for line in str(row[0]).splitlines() if not line.startswith("***"))
            for row in rows
            if row[0] != "ok"
        ]
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise CorruptHistory(self.path, problems[0] + more)

    def _move_settings_to_json(self) -> None:
        """Bring sessions written with one column per setting (before the settings column) to
        this schema, keeping every value. SQLite cannot drop those columns everywhere, so the
        table is rebuilt in one transaction, the way its ALTER TABLE documentation describes."""
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(sessions)")]
        if not columns or "settings" in columns:
            return
        rows = [dict(zip(columns, row)) for row in self._db.execute("SELECT * FROM sessions")]
        with self._db:  # commits, or rolls back to the old table on any error
            self._db.execute("BEGIN")  # sqlite3 would not open the transaction before the DDL
            self._db.execute(SESSIONS.format(name="sessions_new"))
            self._db.executemany(
                "INSERT INTO sessions_new (id, title, named, created, settings) "
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (
                        row["id"],
                        row["title"],
                        row.get("named", 0),
                        row["created"],
                        SessionSettings.from_values(row).to_json(),
                    )
                    for row in rows
                ],
            )
            self._db.execute("DROP TABLE sessions")
            self._db.execute("ALTER TABLE sessions_new RENAME TO sessions")

    def _add_missing_columns(self) -> None:
        """Bring messages and sessions written by an older macbatch up to this schema."""
        for table, added in (("messages", ADDED_COLUMNS), ("sessions", SESSION_ADDED_COLUMNS)):
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, kind in added:
                if name not in columns:  # its default: no reasoning, one version, the first model
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def close(self) -> None:
        """Raises HistoryBusy (closed all the same) when a lock still holds back saves."""
        try:
            if self._kept:  # the last chance to write them: wait longer for the lock
                self._db.execute(f"PRAGMA busy_timeout = {CLOSE_WAIT_MS}")
                with self._db:
                    for write in self._kept.values():
                        write()
        finally:
            self._db.close()

    @property
    def kept(self) -> int:
        """How many saves a lock holds back (written by the next ``flush`` that gets through)."""
        return len(self._kept)

    def flush(self, wait: bool = True) -> bool:
        """Write the saves a lock held back, in one transaction; False while it still holds.
        ``wait=False``: try without waiting for the lock (the app's timer: the UI stays live)."""
        if not self._kept:
            return True
        if not wait:
            self._db.execute("PRAGMA busy_timeout = 0")
        try:
            with self._db:
                for write in self._kept.values():
                    write()
        except HistoryBusy:
            return False
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_WAIT_S * 1000)}")
        self._kept.clear()
        return True

    def _keep(self, key: tuple[str, object], write: Callable[[], object]) -> None:
        """Write now if the file is free, else keep ``write`` for the next flush."""
        self._kept[key] = write
        self.flush()

    # Sessions

    def sessions(self) -> list[Session]:
        rows = self._db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id").fetchall()
        return [_session(row) for row in rows]

    def session(self, session_id: int) -> Session:
        row = self._db.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise KeyError(session_id)
        return _session(row)

    def create_session(
        self, title: str, settings: SessionSettings, model: str | None = None
    ) -> Session:
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO sessions (title, created, settings, model) VALUES (?, ?, ?, ?)",
            (title, now, settings.to_json(), model),
        )
        self._db.commit()
        return Session(int(cursor.lastrowid or 0), title, settings, now, model=model)

    def rename_session(self, session_id: int, title: str) -> None:
        """The user's title: from now on the chat keeps it."""
        self._db.execute(
            "UPDATE sessions SET title = ?, named = 1 WHERE id = ?", (title, session_id)
        )
        self._db.commit()

    def set_automatic_title(self, session_id: int, title: str) -> bool:
        """A title from the chat's first message, unless the user chose one (False then)."""
        cursor = self._db.execute(
            "UPDATE sessions SET title = ? WHERE id = ? AND named = 0", (title, session_id)
        )
        self._db.commit()
        return cursor.rowcount == 1

    def update_settings(self, session_id: int, settings: SessionSettings) -> None:
        self._db.execute(
            "UPDATE sessions SET settings = ? WHERE id = ?", (settings.to_json(), session_id)
        )
        self._db.commit()

    def set_session_model(self, session_id: int, model: str) -> None:
        """The model the chat runs on from its next reply."""
        self._db.execute("UPDATE sessions SET model = ? WHERE id = ?", (model, session_id))
        self._db.commit()

    def delete_session(self, session_id: int) -> None:
        self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        self._db.commit()

    def state(self, key: str) -> str | None:
        """What the app kept under `key` across restarts (the chat open last, the theme)."""
        row = self._db.execute("SELECT value FROM app_state WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_state(self, key: str, value: str) -> None:
        """Kept for later when another process locks the file (it is no action to refuse)."""
        self._keep(
            ("state", key),
            lambda: self._db.execute(
                "INSERT OR REPLACE INTO app_state (key, value) VALUES (?, ?)", (key, value)
            ),
        )

    def last_opened(self) -> int | None:
        """The chat open when the app was last used (it may have been deleted since)."""
        value = self.state("last_opened")
        return None if value is None else int(value)

    def reopened(self) -> Session | None:
        """The chat to reopen: the one open when the app was last used, else the newest (None:
        no chats)."""
        sessions = {session.id: session for session in self.sessions()}
        last = self.last_opened()
        if last in sessions:
            return sessions[last]
        return sessions[max(sessions)] if sessions else None

    def set_last_opened(self, session_id: int) -> None:
        self.set_state("last_opened", str(session_id))

    # Messages

    def messages(self, session_id: int) -> list[Message]:
        self.flush()  # a kept save first: a prompt built from these must see it
        rows = self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ? ORDER BY id",
            (session_id,),
        ).fetchall()
        messages = [_message(row) for row in rows]
        by_id = {m.id: m for m in messages}
        for message_id, *image in self._db.execute(
            "SELECT a.message_id, a.name, a.data, a.width, a.height FROM attachments a JOIN "
            "messages m ON m.id = a.message_id WHERE m.session_id = ? ORDER BY a.id",
            (session_id,),
        ):
            by_id[message_id].images.append(Attachment(*image))
        return messages

    def add_message(
        self,
        session_id: int,
        role: str,
        content: str,
        status: str = DONE,
        images: tuple[Attachment, ...] = (),
    ) -> Message:
        cursor = self._db.execute(
            "INSERT INTO messages (session_id, role, content, status, created) "
            "VALUES (?, ?, ?, ?, ?)",
            (session_id, role, content, status, time.time()),
        )
        message_id = int(cursor.lastrowid or 0)
        self._db.executemany(
            "INSERT INTO attachments (message_id, name, data, width, height) "
            "VALUES (?, ?, ?, ?, ?)",
            [(message_id, i.name, i.data, i.width, i.height) for i in images],
        )
        self._db.commit()
        return Message(message_id, session_id, role, content, status, images=list(images))

    def save_message(self, message: Message) -> None:
        """Write a message's text, status, error, metrics and reasoning back (after edits or
        streaming); kept, as it stands when written, while another process locks the file."""
        self._keep(("message", message.id), lambda: self._update_message(message))

    def _update_message(self, message: Message) -> None:
        metrics, reasoning = message.metrics, message.reasoning
        self._db.execute(
            "UPDATE messages SET content = ?, status = ?, error = ?, tokens = ?, ttft_s = ?, "
            "tokens_per_s = ?, reasoning = ?, reasoning_tokens = ?, reasoning_s = ? WHERE id = ?",
            (
                message.content,
                message.status,
                message.error,
                metrics.tokens if metrics else None,
                metrics.ttft_s if metrics else None,
                metrics.tokens_per_s if metrics else None,
                reasoning.text if reasoning else None,
                reasoning.tokens if reasoning else None,
                reasoning.seconds if reasoning else None,
                message.id,
            ),
        )

    def new_version(self, message: Message) -> Message:
        """Regenerate: keep the reply shown now as one of `message`'s versions, and start the
        next one in its place, empty and streaming (the message keeps its id and place)."""
        with self._db:
            self._keep_shown(message.id)
            self._db.execute(
                "UPDATE messages SET content = '', status = ?, error = NULL, tokens = NULL, "
                "ttft_s = NULL, tokens_per_s = NULL, reasoning = NULL, reasoning_tokens = NULL, "
                "reasoning_s = NULL, version = ? WHERE id = ?",
                (STREAMING, message.versions + 1, message.id),
            )
        return self.message(message.id)

    def show_version(self, message_id: int, number: int) -> Message:
        """Show version `number` of a reply in its place (the chat sends it as context from
        now on); the one shown until now joins the other versions."""
        with self._db:
            stored = self._db.execute(
                f"SELECT {VERSION_COLUMNS} FROM versions WHERE message_id = ? AND number = ?",
                (message_id, number),
            ).fetchone()
            if stored is None:
                raise KeyError((message_id, number))
            self._keep_shown(message_id)
            names = ", ".join(f"{name} = ?" for name in VERSION_FIELDS)
            self._db.execute(
                f"UPDATE messages SET {names}, version = ? WHERE id = ?",
                (*stored, number, message_id),
            )
            self._db.execute(
                "DELETE FROM versions WHERE message_id = ? AND number = ?", (message_id, number)
            )
        return self.message(message_id)

    def _keep_shown(self, message_id: int) -> None:
        """Copy the version a message shows into its versions, under its number."""
        self._db.execute(
            f"INSERT INTO versions (message_id, number, {VERSION_COLUMNS}) "
            f"SELECT id, version, {VERSION_COLUMNS} FROM messages WHERE id = ?",
            (message_id,),
        )

    def message(self, message_id: int) -> Message:
        """One message as stored now (without its images: replies, the ones that change, have
        none)."""
        self.flush()
        row = self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
        if row is None:
            raise KeyError(message_id)
        return _message(row)

    def search(self, text: str, limit: int = 50) -> list[tuple[int, int, str]]:
        """Messages of every chat containing `text` (any case), newest first: (chat id, message
        id, content), at most `limit`."""
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._db.execute(
            "SELECT session_id, id, content FROM messages WHERE content LIKE ? ESCAPE '\\' "
            "ORDER BY id DESC LIMIT ?",
            (pattern, limit),
        ).fetchall()
        return [(int(s), int(m), str(c)) for s, m, c in rows]

    def delete_message(self, message_id: int) -> None:
        """Delete one message (and its images); the rest of its chat stays."""
        self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
        self._db.commit()

    def delete_messages_from(self, session_id: int, message_id: int) -> None:
        """Delete a message and everything after it in its session (regenerate, edit)."""
        self._db.execute(
            "DELETE FROM messages WHERE session_id = ? AND id >= ?", (session_id, message_id)
        )
        self._db.commit()


SESSION_COLUMNS = "id, title, created, named, settings, model"

MESSAGE_COLUMNS = (
    "id, session_id, role, content, status, error, tokens, ttft_s, tokens_per_s, reasoning, "
    "reasoning_tokens, reasoning_s, version, "
    "1 + (SELECT count(*) FROM versions WHERE versions.message_id = messages.id)"
)


def _session(row: tuple) -> Session:
    session_id, title, created, named, settings, model = row
    return Session(
        int(session_id),
        title,
        SessionSettings.from_json(settings),
        float(created),
        bool(named),
        model,
    )


def _message(row: tuple) -> Message:
    message_id, session_id, role, content, status, error, tokens, ttft_s, tokens_per_s = row[:9]
    metrics = None if tokens is None else ReplyMetrics(int(tokens), ttft_s, tokens_per_s)
    text, reasoning_tokens, seconds, version, versions = row[9:]
    reasoning = None if text is None else Reasoning(text, int(reasoning_tokens or 0), seconds)
    return Message(
        int(message_id),
        int(session_id),
        role,
        content,
        status,
        error,
        metrics,
        reasoning,
        version=int(version),
        versions=int(versions),
    )
