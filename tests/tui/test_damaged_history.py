"""A damaged or shared chat history (issue 32): random bytes over a page of chat.sqlite3 are
found at start and said plainly, the file is kept, a fresh history is offered (the damaged one
moved aside under a timestamped name) and declining exits non-zero; a second `macbatch chat` on
the same history is refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.session_settings import SessionSettings
from macbatch.tui.history_file import CorruptHistory, HistoryLock
from macbatch.tui.store import HistoryStore
from tests.support.chat_app import cli

PAGE = 4096


@pytest.fixture
def no_app(monkeypatch: pytest.MonkeyPatch) -> list[HistoryStore]:
    """Stop the command where the app would start; record the store it would have used."""
    from macbatch.tui.app import ChatApp

    started: list[HistoryStore] = []

    def run(self: ChatApp) -> None:
        started.append(self.chats.store)
        self.chats.store.sessions()  # what crashed on a damaged page

    monkeypatch.setattr(ChatApp, "run", run)
    # CliRunner is no terminal: let the command past its terminal check to the app
    monkeypatch.setattr("macbatch.tui.command.terminal_problem", lambda: None)
    return started


def history_with_pages(path: Path) -> None:
    store = HistoryStore(path)
    for i in range(8):
        session = store.create_session(f"chat {i}", SessionSettings())
        for j in range(6):
            store.add_message(session.id, "user", f"question {i}.{j} " + "words " * 150)
    store.close()
    assert path.stat().st_size >= 6 * PAGE


def damage(path: Path, page: int) -> bytes:
    """Random bytes over 1-based ``page``; returns the damaged file's bytes."""
    data = bytearray(path.read_bytes())
    noise = random.Random(page).randbytes(PAGE)
    data[(page - 1) * PAGE : page * PAGE] = noise
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("page", [2, 3, 5])
def test_a_damaged_history_is_said_kept_and_declining_exits_non_zero(
    home: Path, no_app: list, page: int
) -> None:
    path = home / "chat.sqlite3"
    history_with_pages(path)
    damaged = damage(path, page)
    result = CliRunner().invoke(cli(), ["chat", "--history", str(path)], input="n\n")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and not no_app
    assert f"The chat history {path} is damaged" in result.output
    assert "It is kept as it is." in result.output
    assert path.read_bytes() == damaged  # untouched
    assert not list(home.glob("chat.sqlite3.damaged-*"))


def test_no_answer_is_declining(home: Path, no_app: list) -> None:
    path = home / "chat.sqlite3"
    history_with_pages(path)
    damage(path, 2)
    result = CliRunner().invoke(cli(), ["chat", "--history", str(path)])  # no input at all
    assert result.exit_code == 1 and not no_app


def test_accepting_moves_the_damaged_history_aside_and_starts_fresh(
    home: Path, no_app: list
) -> None:
    path = home / "chat.sqlite3"
    history_with_pages(path)
    damaged = damage(path, 3)
    result = CliRunner().invoke(cli(), ["chat", "--history", str(path)], input="y\n")
    assert result.exit_code == 0, result.output
    [aside] = home.glob("chat.sqlite3.damaged-*")
    assert aside.read_bytes() == damaged
    assert f"Moved the damaged history to {aside}" in result.output
    [store] = no_app
    assert store.sessions() == []  # a fresh history, at the same path
    store.close()
    HistoryStore(path).close()  # and it is sound


def test_the_store_finds_the_damage_at_open(tmp_path: Path) -> None:
    path = tmp_path / "chat.sqlite3"
    history_with_pages(path)
    damage(path, 5)
    with pytest.raises(CorruptHistory) as caught:
        HistoryStore(path)
    assert caught.value.path == path and caught.value.problem


def test_a_second_chat_on_one_history_is_refused(home: Path, no_app: list) -> None:
    path = home / "chat.sqlite3"
    lock = HistoryLock(path)  # the first instance
    try:
        result = CliRunner().invoke(cli(), ["chat", "--history", str(path)])
        assert result.exit_code == 1 and not no_app
        assert f"another macbatch chat has the history {path} open" in result.output
    finally:
        lock.release()
    result = CliRunner().invoke(cli(), ["chat", "--history", str(path)])
    assert result.exit_code == 0 and len(no_app) == 1  # free again once the first is gone
