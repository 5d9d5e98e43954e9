"""``ask``'s conversations kept in the chat history (``chat.sqlite3``, the chat app's
``HistoryStore``), so that ``ask -c`` continues the last one, ``macbatch history QUERY`` finds
them, and they open in ``macbatch chat`` as chats of their own. The history is opened only
under its lock (``HistoryLock``: one writer at a time, as chat takes it), and only around a
read or a write, never while the model generates."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from macbatch.session_settings import SessionSettings

if TYPE_CHECKING:
    from macbatch.tui.store import HistoryStore

LAST_ASK = "last_ask"  # app_state key: the chat that `ask -c` continues
TITLE_CHARS = 60


@dataclass(frozen=True)
class Conversation:
    """An ask conversation so far: its chat, model, settings and messages (OpenAI roles)."""

    session_id: int
    model: str | None
    settings: SessionSettings
    messages: list[dict[str, str]]


@contextmanager
def opened(path: Path) -> Iterator[HistoryStore]:
    """The history under its lock (``HistoryError`` when chat or another ask holds it)."""
    from macbatch.tui.history_file import HistoryLock
    from macbatch.tui.store import HistoryStore

    lock = HistoryLock(path)
    try:
        store = HistoryStore(path)
        try:
            yield store
        finally:
            store.close()
    finally:
        lock.release()


def last_conversation(path: Path) -> Conversation | None:
    """The conversation ``ask`` had last (None: none yet, or its chat was deleted since)."""
    with opened(path) as store:
        kept = store.state(LAST_ASK)
        if kept is None:
            return None
        try:
            session = store.session(int(kept))
        except (KeyError, ValueError):
            return None
        messages = [
            {"role": m.role, "content": m.content}
            for m in store.messages(session.id)
            if m.role in ("user", "assistant") and not m.error
        ]
        return Conversation(session.id, session.model, session.settings, messages)


def save_turn(
    path: Path,
    conversation: Conversation | None,
    model: str,
    settings: SessionSettings,
    question: str,
    reply: str,
) -> int:
    """Write one question and its reply, into ``conversation``'s chat or a new one named by
    the question; that chat is what ``ask -c`` continues next. Its id."""
    with opened(path) as store:
        if conversation is None:
            title = " ".join(question.split())[:TITLE_CHARS] or "ask"
            session_id = store.create_session(title, settings).id
        else:
            session_id = conversation.session_id
            store.update_settings(session_id, settings)
        store.set_session_model(session_id, model)
        store.add_message(session_id, "user", question)
        store.add_message(session_id, "assistant", reply)
        store.set_state(LAST_ASK, str(session_id))
        store.flush()
        return session_id


def search(path: Path, query: str, limit: int) -> list[tuple[int, str, str]]:
    """Messages of every chat (ask's and chat's) holding ``query``, newest first: (chat id,
    chat title, message)."""
    with opened(path) as store:
        titles = {s.id: s.title for s in store.sessions()}
        return [(s, titles.get(s, "?"), text) for s, _, text in store.search(query, limit)]
