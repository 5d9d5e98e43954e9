"""No keystroke is lost to the focus, and the transcript scrolls from the keyboard (issue 50):
Esc and switching chats bring the focus back to the message box, letters (and `?`) typed while
a message, the transcript or the chat list has the focus land in the box in the order typed,
PageUp / PageDown / Home / End scroll the open chat from the box, and the theme chosen with
ctrl+p survives a restart."""

from __future__ import annotations

from pathlib import Path

from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.screens.help import HelpScreen
from macbatch.tui.store import HistoryStore
from macbatch.tui.widgets.message_box import MessageBox
from macbatch.tui.widgets.message_view import MessageView
from tests.support.chat_app import GREEDY, type_ahead, wait_for


def seed(home: Path, chats: int, messages: int) -> list[int]:
    """`chats` chats of `messages` long messages each in the history the app opens."""
    store = HistoryStore(home / "chat.sqlite3")
    ids = []
    for n in range(chats):
        session = store.create_session(f"Chat {n + 1}", GREEDY)
        for i in range(messages):
            role = "user" if i % 2 == 0 else "assistant"
            store.add_message(session.id, role, f"message {i}\n\n" + "a line of text\n\n" * 4)
        ids.append(session.id)
    store.set_last_opened(ids[0])
    store.close()
    return ids


async def test_esc_brings_the_focus_back_and_typed_letters_are_kept(make_app, home):
    seed(home, 2, 4)
    app = make_app()
    async with app.run_test() as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        message = screen.transcript(screen.current).views[0]
        screen.set_focus(message)
        await pilot.pause()
        type_ahead(app, "escape", "h", "i", "?")  # as fast as a terminal delivers them
        await wait_for(pilot, lambda: screen.message_box.text == "hi?", timeout=10)
        assert app.screen is screen and isinstance(app.focused, MessageBox)

        # Letters typed while a message still has the focus go into the box, in order.
        screen.message_box.clear()
        screen.set_focus(screen.transcript(screen.current).views[1])
        await pilot.pause()
        type_ahead(app, *"what?", "backspace", "!")
        await wait_for(pilot, lambda: screen.message_box.text == "what!", timeout=10)
        assert app.screen is screen

        # Switching chats from the chat list leaves the focus in the box, ready to type.
        screen.message_box.clear()
        screen.set_focus(screen.session_list)
        await pilot.press("ctrl+pagedown")
        assert isinstance(app.focused, MessageBox)
        type_ahead(app, "o", "k")
        await wait_for(pilot, lambda: screen.message_box.text == "ok", timeout=10)


async def test_the_message_box_scrolls_the_transcript(make_app, home):
    seed(home, 1, 40)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        transcript = screen.transcript(screen.current)
        await wait_for(pilot, lambda: transcript.max_scroll_y > 0, timeout=10)
        await pilot.pause(0.2)
        assert transcript.scroll_y == transcript.max_scroll_y  # a chat opens at its end
        assert isinstance(app.focused, MessageBox)

        # Compared with the end as laid out now: on a slow machine the messages may still be
        # settling (a scrollbar, a re-wrapped line) between the keys.
        await pilot.press("pageup")
        assert 0 < transcript.scroll_y < transcript.max_scroll_y
        await pilot.press("pagedown")
        assert transcript.scroll_y == transcript.max_scroll_y
        await pilot.press("home")  # the box is empty: Home goes to the chat's start
        assert transcript.scroll_y == 0
        await pilot.press("end")
        assert transcript.scroll_y == transcript.max_scroll_y  # the end as laid out now
        await pilot.press("ctrl+home")
        assert transcript.scroll_y == 0
        assert isinstance(app.focused, MessageBox)

        # With text in the box, Home and End move in the line, as in any text box.
        await pilot.press(*"abc", "home", "x")
        assert screen.message_box.text == "xabc" and transcript.scroll_y == 0

        # The transcript takes the focus and scrolls with the arrow keys.
        assert transcript.focusable
        screen.set_focus(transcript)
        await pilot.press("down", "down")
        assert transcript.scroll_y > 0

        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        rows = app.screen.rows
        keys = {(where, keys) for where, keys, _ in rows}
        assert ("Message box", "pgup") in keys and ("Message box", "pgdn") in keys
        assert ("Transcript (focused)", "↑") in keys
        actions = " ".join(action for _, _, action in rows)
        for text in ("/image PATH", "/detach", "ctrl+p"):
            assert text in " ".join(f"{k} {a}" for _, k, a in rows)
        assert "Regenerate the last reply" in actions and "Scroll the chat up" in actions


async def test_help_opens_on_f1_only_and_says_what_each_key_does(make_app, home):
    seed(home, 1, 2)
    app = make_app()
    async with app.run_test() as pilot:
        screen = app.screen
        await pilot.press("question_mark")  # a character: it goes into the box
        assert app.screen is screen and screen.message_box.text == "?"
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        rows = app.screen.rows
        for binding in [*ChatScreen.BINDINGS, *MessageView.BINDINGS]:
            label = binding.tooltip or binding.description
            assert any(action == label for _, _, action in rows), label
        assert ("Anywhere", "^pgup, alt+↑", "Previous chat") in rows
        assert not any(keys.startswith("?") or ", ?" in keys for _, keys, _ in rows[:-8])


async def test_the_theme_chosen_is_kept_across_restarts(make_app, home):
    app = make_app()
    async with app.run_test() as pilot:
        assert app.theme != "nord"
        app.theme = "nord"  # what the command palette's theme picker sets
        await pilot.pause()
    again = make_app()
    async with again.run_test() as pilot:
        await pilot.pause()
        assert again.theme == "nord"
