"""A message too long for the model's context (issue 50): one clear error, the text kept in the
box, nothing stored, no notice about older turns left out; an error's line says "error" once."""

from __future__ import annotations

from textual.widgets import Static

from macbatch.tui.store import ERROR, HistoryStore
from tests.support.chat_app import GREEDY, wait_for


async def test_a_message_longer_than_the_context_is_refused_and_kept(make_app, home):
    store = HistoryStore(home / "chat.sqlite3")
    session = store.create_session("Long chat", GREEDY)
    for i in range(12):
        store.add_message(session.id, "user" if i % 2 == 0 else "assistant", f"turn {i}")
    failed = store.add_message(session.id, "assistant", "", ERROR)
    failed.error = "the engine failed this request"
    store.save_message(failed)
    store.close()
    paste = "lorem ipsum dolor sit amet " * 1000  # ~27,000 characters

    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        meta = screen.transcript(session.id).views[-1].query_one(".meta", Static)
        assert str(meta.render()) == "error: the engine failed this request"

        screen.message_box.text = paste
        await pilot.press("enter")
        await pilot.pause()
        assert screen.message_box.text == paste  # nothing lost
        assert [m.content for m in app.chats.messages(session.id)][-1] == ""  # nothing stored
        assert not app.chats.replies
        notices = [str(n.message) for n in app._notifications if "ready" not in str(n.message)]
        assert len(notices) == 1, notices
        (notice,) = notices
        context = app.chats.engine.context_limit()
        assert notice.startswith("This message is too long for the model: ")
        assert f"its context holds {context:,} (the model's context length)" in notice
        assert notice.count("error") == 0 and "left out" not in notice

        screen.message_box.text = "a short one"  # the chat still works
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.chats.replies)
        assert app.chats.messages(session.id)[-2].content == "a short one"
