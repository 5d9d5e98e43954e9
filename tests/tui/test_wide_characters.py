"""Characters whose width terminals disagree on (issue 50: a stray character drawn over a
border). "❤️" (U+2764 U+FE0F) is two cells for Textual and one in tmux 3.3; "👍🏽" (a skin-tone
modifier) two for Textual and four in tmux: drawn, the rest of the line shifts and a border is
drawn over. The app shows them without the variation selector or modifier (the same width
everywhere), while the history, copies and the export keep the text as written."""

from __future__ import annotations

from dataclasses import replace

from textual.widgets import Markdown

from macbatch.tui.store import HistoryStore
from tests.support.chat_app import GREEDY

TITLE = "Thanks ❤️"
QUESTION = "Great job 👍🏽 ✔️"
REPLY = "⚠️ Careful: ❤️ and 👋🏿 here"
MODIFIERS = ("\ufe0f", "\ufe0e", "\U0001f3fd", "\U0001f3ff")


def seed(home) -> int:
    store = HistoryStore(home / "chat.sqlite3")
    session = store.create_session(TITLE, replace(GREEDY, system_prompt="Use ✔️ marks."))
    store.add_message(session.id, "user", QUESTION)
    store.add_message(session.id, "assistant", REPLY)
    store.close()
    return session.id


def drawn(text: str) -> bool:
    """Whether `text` is free of the characters that shift a line."""
    return not any(m in text for m in MODIFIERS)


async def test_width_modifiers_are_not_drawn_but_kept(make_app, home):
    session_id = seed(home)
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        label = str(screen.session_list.item_for(session_id).label.render())
        assert label.strip() == "Thanks ❤" and drawn(label)
        assert screen.transcripts.border_title == "Thanks ❤"
        assert screen.transcripts.border_subtitle == "system: Use ✔ marks."
        sources = [v.query_one(Markdown).source for v in screen.transcript(session_id).views]
        assert sources == ["Great job 👍 ✔", "⚠ Careful: ❤ and 👋 here"]
        for line in app.export_screenshot().splitlines():
            assert drawn(line)

        await pilot.press("ctrl+l")
        assert app.clipboard == REPLY  # the text as written
        await pilot.press("ctrl+o")
    messages = HistoryStore(home / "chat.sqlite3").messages(session_id)
    assert [m.content for m in messages] == [QUESTION, REPLY]
    exported = (home / "exports" / f"chat-{session_id}.md").read_text()
    assert TITLE in exported and QUESTION in exported and REPLY in exported
