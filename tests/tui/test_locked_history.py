"""A chat history another process holds (issue 61, item 7): a message sent while another
process holds ``BEGIN EXCLUSIVE`` on chat.sqlite3 stays in the box with a notice naming the
holder (no crash), and is stored once sent again after the lock goes; a history locked at start is
said to be held, by whom, and how to go on, never called a history to abandon; a symlinked
``--history`` takes the one-chat lock of the file it points to; a crash of the app exits
non-zero."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.tui.app import ChatApp
from macbatch.tui.history_file import HistoryLock
from macbatch.tui.store import HistoryStore
from tests.support.chat_app import cli, first_reply, send, wait_for
from tests.support.sqlite_lock import exclusive_lock


def stored_user_messages(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:  # re-read from the file, by another connection
        rows = db.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id")
        return [str(text) for (text,) in rows]


def notices(app: ChatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_a_message_sent_during_a_lock_is_kept_and_stored_after(
    make_app: Callable[..., ChatApp], home: Path
) -> None:
    path = home / "chat.sqlite3"
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello")
        with exclusive_lock(path) as pid:
            await send(pilot, screen, "sent during the lock")
            await wait_for(pilot, lambda: any("another process" in n for n in notices(app)))
            assert screen.message_box.text == "sent during the lock"  # kept, not lost
            assert not screen.chats.replies
        (notice,) = [n for n in notices(app) if "another process" in n]
        assert f"pid {pid}" in notice and "still in the box" in notice
        await pilot.press("enter")  # the lock is gone: send it again
        await wait_for(pilot, lambda: stored_user_messages(path)[-1:] == ["sent during the lock"])
        await wait_for(pilot, lambda: not screen.chats.replies)
    assert app._exception is None  # no crash
    assert stored_user_messages(path) == ["hello", "sent during the lock"]


def test_a_history_locked_at_start_is_held_not_damaged(home: Path) -> None:
    path = home / "chat.sqlite3"
    HistoryStore(path).close()
    with exclusive_lock(path) as pid:
        result = CliRunner().invoke(cli(), ["chat", "--history", str(path)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "Move the file away" not in result.output
    assert f"another process (pid {pid}" in result.output
    assert "start macbatch chat again" in result.output


@pytest.mark.parametrize("locked", ["real", "link"])
def test_a_symlinked_history_takes_the_lock_of_its_file(
    home: Path, locked: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ChatApp, "run", lambda self: None)  # a chat let through stops here
    real = home / "chat.sqlite3"
    link = home / "elsewhere.sqlite3"
    link.symlink_to(real)
    other = link if locked == "real" else real
    lock = HistoryLock(real if locked == "real" else link)
    try:
        result = CliRunner().invoke(cli(), ["chat", "--history", str(other)])
    finally:
        lock.release()
    assert result.exit_code == 1, result.output
    assert "another macbatch chat has the history" in result.output


def test_a_crash_of_the_app_exits_non_zero(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual prints the traceback and returns from ``run``; the command must not exit 0."""
    from textual.app import App

    def crash(self: ChatApp) -> None:
        raise RuntimeError("a crash inside the app")

    monkeypatch.setattr(ChatApp, "on_mount", crash)
    monkeypatch.setattr(ChatApp, "run", lambda self: App.run(self, headless=True))
    monkeypatch.setattr("macbatch.tui.command.terminal_problem", lambda: None)  # headless here
    result = CliRunner().invoke(cli(), ["chat", "--history", str(home / "chat.sqlite3")])
    assert result.exit_code == 1, result.output
