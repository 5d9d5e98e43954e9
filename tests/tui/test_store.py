"""The history store on disk, and how a session's history becomes an engine prompt."""

from __future__ import annotations

import sqlite3

import pytest

from macbatch.session_settings import SessionSettings
from macbatch.tui.conversation import prompt_messages, title_from
from macbatch.tui.history_file import HistoryError
from macbatch.tui.store import (
    DONE,
    ERROR,
    INTERRUPTED,
    STREAMING,
    HistoryStore,
    Reasoning,
    ReplyMetrics,
)


def test_sessions_and_messages_round_trip_through_the_file(tmp_path):
    path = tmp_path / "chat.sqlite3"
    store = HistoryStore(path)
    settings = SessionSettings("Be brief.", 0.2, 0.9, 64)
    first = store.create_session("First", settings)
    second = store.create_session("Second", SessionSettings())
    question = store.add_message(first.id, "user", "hi")
    reply = store.add_message(first.id, "assistant", "", STREAMING)
    reply.content, reply.metrics = "hello", ReplyMetrics(3, 0.25, 40.0)
    store.save_message(reply)
    store.rename_session(second.id, "Renamed")
    store.close()

    again = HistoryStore(path)
    assert [(s.title, s.settings) for s in again.sessions()] == [
        ("First", settings),
        ("Renamed", SessionSettings()),
    ]
    # The reply was still streaming when the first store closed: it comes back interrupted.
    messages = again.messages(first.id)
    assert [(m.id, m.role, m.content, m.status) for m in messages] == [
        (question.id, "user", "hi", DONE),
        (reply.id, "assistant", "hello", INTERRUPTED),
    ]
    assert messages[1].metrics == ReplyMetrics(3, 0.25, 40.0)
    raw = sqlite3.connect(path).execute("SELECT count(*) FROM messages").fetchone()
    assert raw == (2,)

    again.delete_messages_from(first.id, reply.id)
    assert [m.id for m in again.messages(first.id)] == [question.id]
    again.delete_session(first.id)
    assert [s.id for s in again.sessions()] == [second.id]
    assert sqlite3.connect(path).execute("SELECT count(*) FROM messages").fetchone() == (0,)


def test_a_file_that_is_not_a_database_gets_a_clear_error(tmp_path):
    path = tmp_path / "chat.sqlite3"
    path.write_text("not a database, just text " * 100)
    with pytest.raises(HistoryError, match="Move the file away"):
        HistoryStore(path)


def test_prompt_has_the_system_prompt_and_skips_failed_replies(tmp_path):
    store = HistoryStore(tmp_path / "chat.sqlite3")
    session = store.create_session("s", SessionSettings(system_prompt="Be brief."))
    store.add_message(session.id, "user", "one")
    failed = store.add_message(session.id, "assistant", "", ERROR)
    store.add_message(session.id, "user", "two")
    partial = store.add_message(session.id, "assistant", "half a rep", INTERRUPTED)
    assert failed.status == ERROR and partial.status == INTERRUPTED
    assert prompt_messages(session, store.messages(session.id)) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "half a rep"},
    ]


def test_thinking_choice_round_trips_and_old_histories_gain_the_column(tmp_path):
    path = tmp_path / "chat.sqlite3"
    write_first_release_history(path, (1, "Old", "", 0.5, 1.0, 64, 0.0))
    store = HistoryStore(path)
    assert store.session(1).settings == SessionSettings("", 0.5, 1.0, 64, thinking=None)
    store.update_settings(1, SessionSettings("", 0.5, 1.0, 64, thinking=False))
    on = store.create_session("New", SessionSettings(thinking=True))
    store.close()
    again = HistoryStore(path)
    assert again.session(1).settings.thinking is False
    assert again.session(on.id).settings.thinking is True


def test_reasoning_is_kept_with_its_reply_and_never_sent_back(tmp_path):
    """A history from before reasoning was stored (messages without its columns) gains them;
    a reply's reasoning survives a reopen, and the next turn's prompt carries only answers."""
    path = tmp_path / "chat.sqlite3"
    write_first_release_history(path, (1, "Old", "", 0.5, 1.0, 64, 0.0))
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id INTEGER NOT NULL "
        "REFERENCES sessions(id) ON DELETE CASCADE, role TEXT NOT NULL, content TEXT NOT NULL, "
        "status TEXT NOT NULL DEFAULT 'done', error TEXT, tokens INTEGER, ttft_s REAL, "
        "tokens_per_s REAL, created REAL NOT NULL)"
    )
    old.execute(
        "INSERT INTO messages (session_id, role, content, created) VALUES (1, 'user', 'q', 0)"
    )
    old.commit()
    old.close()

    store = HistoryStore(path)
    [question] = store.messages(1)
    assert (question.content, question.reasoning) == ("q", None)
    reply = store.add_message(1, "assistant", "", STREAMING)
    reply.content, reply.status = "4", DONE
    reply.reasoning = Reasoning("2 and 2 make 4.", 7, 1.5)
    store.save_message(reply)
    store.close()

    again = HistoryStore(path)
    history = again.messages(1)
    assert history[1].reasoning == Reasoning("2 and 2 make 4.", 7, 1.5)
    assert prompt_messages(again.session(1), history) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "4"},
    ]


def test_automatic_titles_and_the_last_chat_survive_a_reopen(tmp_path):
    path = tmp_path / "chat.sqlite3"
    store = HistoryStore(path)
    first = store.create_session("Chat 1", SessionSettings())
    second = store.create_session("Chat 2", SessionSettings())
    assert store.last_opened() is None
    store.set_last_opened(first.id)
    assert store.set_automatic_title(first.id, "From the first message")
    store.rename_session(second.id, "Mine")
    assert not store.set_automatic_title(second.id, "From the first message")
    store.close()

    again = HistoryStore(path)
    assert [(s.title, s.named) for s in again.sessions()] == [
        ("From the first message", False),
        ("Mine", True),
    ]
    assert again.last_opened() == first.id


def test_a_history_from_before_titles_were_automatic_opens(tmp_path):
    path = tmp_path / "chat.sqlite3"
    write_first_release_history(path, (7, "Old chat", "", 0.5, 1.0, 64, 0.0))
    store = HistoryStore(path)
    (session,) = store.sessions()
    assert (session.id, session.title, session.named) == (7, "Old chat", False)
    assert session.settings == SessionSettings("", 0.5, 1.0, 64)
    store.rename_session(7, "Renamed")
    assert store.session(7).named


def test_a_title_is_the_first_message_on_one_line_cut_at_a_word():
    assert title_from("  Hello\n\n  world  ") == "Hello world"
    long = "How do I sort a dict by value in Python, keeping ties stable?"
    assert title_from(long) == "How do I sort a dict by value in Python…"
    assert title_from("a" * 100) == "a" * 39 + "…"
    cut = title_from("word " * 7 + "supercalifragilistic")
    assert cut == "word word word word word word word…"


def write_first_release_history(path, session: tuple) -> None:
    """A history as the first macbatch wrote it (no thinking or named column), one session."""
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, "
        "system_prompt TEXT NOT NULL DEFAULT '', temperature REAL NOT NULL, top_p REAL NOT NULL, "
        "max_tokens INTEGER NOT NULL, created REAL NOT NULL)"
    )
    old.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)", session)
    old.commit()
    old.close()


# The schema before settings moved to one JSON column, copied from macbatch/tui/store.py as it
# was then; a history written by that version also has the reasoning columns, added on open.
SCHEMA_WITH_A_COLUMN_PER_SETTING = """
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    named INTEGER NOT NULL DEFAULT 0,
    system_prompt TEXT NOT NULL DEFAULT '',
    temperature REAL NOT NULL,
    top_p REAL NOT NULL,
    max_tokens INTEGER NOT NULL,
    created REAL NOT NULL,
    thinking INTEGER
);
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
CREATE TABLE IF NOT EXISTS app_state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
ALTER TABLE messages ADD COLUMN reasoning TEXT;
ALTER TABLE messages ADD COLUMN reasoning_tokens INTEGER;
ALTER TABLE messages ADD COLUMN reasoning_s REAL;
"""


def test_a_history_with_a_column_per_setting_keeps_every_value(tmp_path):
    path = tmp_path / "chat.sqlite3"
    # (id, title, named, system_prompt, temperature, top_p, max_tokens, created, thinking)
    rows = [
        (3, "Greedy", 0, "", 0.0, 1.0, 24, 100.5, None),
        (5, "Mine", 1, "Be brief.\nAnswer in French.", 1.25, 0.9, 3000, 200.25, 0),
        (9, "Thinks", 0, "You are a poet.", 2.0, 0.05, 1, 300.0, 1),
    ]
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_WITH_A_COLUMN_PER_SETTING)
    old.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    old.execute(
        "INSERT INTO messages (session_id, role, content, status, tokens, ttft_s, tokens_per_s, "
        "reasoning, reasoning_tokens, reasoning_s, created) "
        "VALUES (5, 'assistant', 'Bonjour', 'done', 3, 0.5, 12.0, 'Hmm.', 2, 0.25, 0)"
    )
    old.execute("INSERT INTO app_state VALUES ('last_opened', '5')")
    old.commit()
    old.close()

    store = HistoryStore(path)
    sessions = store.sessions()
    assert [s.model for s in sessions] == [None, None, None]  # the model chat starts with
    assert [(s.id, s.title, s.named, s.created) for s in sessions] == [
        (3, "Greedy", False, 100.5),
        (5, "Mine", True, 200.25),
        (9, "Thinks", False, 300.0),
    ]
    assert [s.settings for s in sessions] == [
        SessionSettings("", 0.0, 1.0, 24, thinking=None),
        SessionSettings("Be brief.\nAnswer in French.", 1.25, 0.9, 3000, thinking=False),
        SessionSettings("You are a poet.", 2.0, 0.05, 1, thinking=True),
    ]
    [reply] = store.messages(5)
    assert (reply.content, reply.metrics, reply.reasoning) == (
        "Bonjour",
        ReplyMetrics(3, 0.5, 12.0),
        Reasoning("Hmm.", 2, 0.25),
    )
    assert store.last_opened() == 5
    fresh = store.create_session("New", SessionSettings())
    assert fresh.id == 10  # AUTOINCREMENT goes on after the old ids
    store.delete_session(5)  # the foreign key still holds: its messages go with it
    store.close()

    raw = sqlite3.connect(path)
    columns = [row[1] for row in raw.execute("PRAGMA table_info(sessions)")]
    assert columns == ["id", "title", "named", "created", "settings", "model"]
    assert raw.execute("SELECT count(*) FROM messages").fetchone() == (0,)
    assert raw.execute("PRAGMA foreign_key_check").fetchall() == []


def test_stored_settings_read_by_name_so_a_new_setting_needs_no_migration(tmp_path):
    """Settings stored before a setting existed read as its default; one since removed, a value
    of the wrong type, or one the engine now refuses must not keep the history from opening."""
    path = tmp_path / "chat.sqlite3"
    HistoryStore(path).close()
    raw = sqlite3.connect(path)
    stored = [
        '{"temperature": 0.3}',
        '{"system_prompt": "Hi.", "top_p": 0.5, "retired": 7, "thinking": true}',
        '{"temperature": 9.0, "max_tokens": "many", "top_p": 0.25}',
    ]
    raw.executemany(
        "INSERT INTO sessions (title, created, settings) VALUES ('s', 0, ?)",
        [(text,) for text in stored],
    )
    raw.commit()
    with pytest.raises(sqlite3.IntegrityError):  # the column takes JSON only
        raw.execute("INSERT INTO sessions (title, created, settings) VALUES ('s', 0, 'top_p')")
    raw.close()
    assert [s.settings for s in HistoryStore(path).sessions()] == [
        SessionSettings(temperature=0.3),
        SessionSettings("Hi.", top_p=0.5, thinking=True),
        SessionSettings(top_p=0.25),
    ]


def test_a_history_from_before_versions_opens_and_keeps_versions(tmp_path):
    """Messages written before regenerate kept versions gain the column (one version each),
    and a reply from then can be regenerated and flipped back."""
    path = tmp_path / "chat.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_WITH_A_COLUMN_PER_SETTING)
    old.execute("INSERT INTO sessions VALUES (1, 'Old', 0, '', 0.0, 1.0, 24, 0, NULL)")
    old.execute(
        "INSERT INTO messages (session_id, role, content, status, tokens, created) "
        "VALUES (1, 'user', 'hi', 'done', NULL, 0), (1, 'assistant', 'Hello', 'done', 2, 0)"
    )
    old.commit()
    old.close()

    store = HistoryStore(path)
    user, reply = store.messages(1)
    assert [(m.version, m.versions) for m in (user, reply)] == [(1, 1), (1, 1)]
    fresh = store.new_version(reply)
    assert (fresh.id, fresh.content, fresh.status, fresh.metrics) == (reply.id, "", STREAMING, None)
    assert (fresh.version, fresh.versions) == (2, 2)
    fresh.content, fresh.status, fresh.metrics = "Hi there", DONE, ReplyMetrics(3)
    store.save_message(fresh)
    back = store.show_version(reply.id, 1)
    assert (back.content, back.metrics, back.version, back.versions) == (
        "Hello",
        ReplyMetrics(2),
        1,
        2,
    )
    assert store.show_version(reply.id, 2).content == "Hi there"
    store.delete_messages_from(1, user.id)  # an edit: the versions go with their reply
    store.close()

    raw = sqlite3.connect(path)
    assert raw.execute("SELECT count(*) FROM versions").fetchone() == (0,)
