"""What a daily chat needs beyond sending (issue 50), on the real app: copy the last reply or
its code block with one key, a chat list that hides (and narrows on a small terminal), the system
prompt shown, F3 refused at once for a text-only model, dialogs that apply fast keys in order,
and an export with the model, dates and no raw control characters."""

from __future__ import annotations

import re
from dataclasses import replace

from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.screens.settings import SettingsScreen
from macbatch.tui.store import HistoryStore
from tests.support.chat_app import GREEDY, type_ahead, wait_for

REPLY = "Here:\n\n```python\nprint('hi')\nx = 1\n```\n\nand a bell \x07 and an escape \x1b[2J."


def seed(home) -> int:
    store = HistoryStore(home / "chat.sqlite3")
    session = store.create_session("Code", replace(GREEDY, system_prompt="Be brief.\nVery."))
    store.add_message(session.id, "user", "show me code")
    store.add_message(session.id, "assistant", REPLY)
    store.close()
    return session.id


async def test_copy_keys_sidebar_and_system_prompt(make_app, home):
    session_id = seed(home)
    app = make_app()
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.current == session_id
        assert screen.transcripts.border_subtitle == "system: Be brief. Very."

        await pilot.press("ctrl+l")
        assert app.clipboard == REPLY
        await pilot.press("ctrl+t")
        assert app.clipboard == "print('hi')\nx = 1"

        wide = screen.session_list.outer_size.width
        await pilot.press("f9")
        assert not screen.session_list.display
        await pilot.press("f9")
        assert screen.session_list.display

        await pilot.press("ctrl+n", "ctrl+l")  # a new chat has nothing to copy: says so
        assert app.clipboard == "print('hi')\nx = 1"
        assert any("No reply to copy yet" in str(n.message) for n in app._notifications)
        await pilot.pause(0.3)
        status = screen.query_one("#status").region
        toasts = list(app.screen.query("Toast"))
        assert toasts
        for toast in toasts:  # notifications leave the status bar (and footer) visible
            assert toast.region.bottom <= status.y, (toast.region, status)
        assert screen.transcripts.border_subtitle is None  # no system prompt in a new chat

    small = make_app()
    async with small.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        narrow = small.screen.session_list.outer_size.width
        assert narrow < wide and narrow <= 60 // 3


async def test_f3_is_refused_at_once_for_a_text_only_model(make_app, home):
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await pilot.press("f3")
        assert app.screen is screen  # no dialog to fill in first
        (notice,) = [str(n.message) for n in app._notifications if "ready" not in str(n.message)]
        assert notice.startswith("Cannot attach an image: ") and "text-only" in notice


async def test_settings_apply_fast_keys_in_order(make_app, home):
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        await pilot.press("ctrl+s")
        dialog = app.screen
        assert isinstance(dialog, SettingsScreen)
        field = dialog.query_one("#temperature")
        field.value = "2.5"
        field.cursor_position = len(field.value)
        dialog.set_focus(field)
        await pilot.pause()
        type_ahead(app, "backspace", "backspace", "backspace", "3")
        await wait_for(pilot, lambda: field.value == "3", timeout=5)


async def test_export_has_the_model_and_dates_and_no_control_characters(
    make_app, home, tiny_model_path
):
    session_id = seed(home)
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)  # the label becomes the loaded model's
        await pilot.press("ctrl+o")
        await pilot.pause()
    text = (home / "exports" / f"chat-{session_id}.md").read_text()
    assert f"- model: {tiny_model_path.name}\n" in text
    date = r"\d{4}-\d\d-\d\d \d\d:\d\d [+-]\d{4}"
    assert re.search(rf"^- started: {date}$", text, re.M)
    assert re.search(rf"^- exported: {date}$", text, re.M)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)
    assert "a bell \u2407 and an escape \u241b[2J." in text
    assert "print('hi')\nx = 1" in text


async def test_the_status_bar_and_context_meter_follow_a_reply_at_once(make_app, monkeypatch):
    """No timer tick between a reply's end and the bar saying so (issue 50: it lagged ~1 s)."""
    from macbatch.tui.screens import chat

    monkeypatch.setattr(chat, "STATUS_EVERY_S", 3600.0)  # only events refresh it now
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await pilot.pause()
        screen.message_box.text = "hello world"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.chats.replies)
        await pilot.pause()
        reply = app.chats.engine.outputs[-1][-1]
        used = reply.metrics.prompt_tokens + len(reply.token_ids)
        limit = app.chats.engine.context_limit()
        bar = str(screen.query_one("#status").render())
        assert "0 running" in bar
        assert f"last prompt {reply.metrics.cached_tokens:,}/{reply.metrics.prompt_tokens:,}" in bar
        meter = f"context {used:,}/{limit:,} tok"
        assert screen.transcripts.border_subtitle.startswith(meter)


async def test_search_finds_a_message_in_any_chat_and_opens_it(make_app, home):
    store = HistoryStore(home / "chat.sqlite3")
    chats = []
    for n, words in enumerate(["apples and pears", "the 50% discount_code", "nothing here"]):
        session = store.create_session(f"Chat {n}", GREEDY)
        store.add_message(session.id, "user", f"tell me about {words}")
        store.add_message(session.id, "assistant", "filler " * 200 + "end")
        chats.append(session.id)
    store.set_last_opened(chats[2])
    store.close()
    app = make_app()
    async with app.run_test() as pilot:
        screen = app.screen
        await pilot.press("ctrl+f")
        type_ahead(app, *"50%", " ", *"DISCOUNT_")  # %, _ and case: found as typed
        await wait_for(pilot, lambda: len(app.screen.hits) == 1, timeout=10)
        (hit,) = app.screen.hits
        assert hit[0] == chats[1] and "50% discount_code" in hit[2]
        await pilot.press("enter")
        assert app.screen is screen and screen.current == chats[1]
        assert screen.message_box.has_focus

        await pilot.press("ctrl+f", *"pears", "down", "enter")
        assert screen.current == chats[0]


async def test_edit_or_delete_any_message(make_app, home):
    store = HistoryStore(home / "chat.sqlite3")
    session = store.create_session("Three turns", GREEDY)
    for i in range(3):
        store.add_message(session.id, "user", f"question {i}")
        store.add_message(session.id, "assistant", f"answer {i}")
    store.close()
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        views = screen.transcript(session.id).views
        screen.set_focus(views[3])  # "answer 1"
        await pilot.pause()
        assert app.focused is views[3]
        await pilot.press("delete")
        assert type(app.screen).__name__ == "ConfirmScreen", app.screen
        await pilot.press("y")
        await pilot.pause()
        kept = [m.content for m in app.chats.messages(session.id)]
        assert kept == ["question 0", "answer 0", "question 1", "question 2", "answer 2"]
        assert [v.message.content for v in screen.transcript(session.id).views] == kept

        screen.set_focus(screen.transcript(session.id).views[0])  # "question 0"
        await pilot.press("ctrl+g")
        assert screen.message_box.text == "question 0"
        screen.message_box.text = "question zero"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.chats.replies)
        contents = [m.content for m in app.chats.messages(session.id)]
        assert contents[0] == "question zero" and len(contents) == 2  # the rest was dropped
        (prompt,) = app.chats.engine.prompts[-1:]
        assert [m["content"] for m in prompt] == ["question zero"]
