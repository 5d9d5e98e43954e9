"""Keys in the message box (issue 65, item 8): ctrl+g puts the cursor at the end of the message it
edits; Option+Left / Option+Right as macOS terminals send them (`ESC b`, `ESC f`, read by
Textual's own terminal parser) move by word; and a paste in a terminal without bracketed paste,
whose line breaks arrive as Enter, is kept as one message with its line breaks, told apart from
keys typed ahead by the times the keys were read (injected here, so no machine is too slow)."""

from __future__ import annotations

from textual import events
from textual._xterm_parser import XTermParser
from textual.message import Message

from tests.support.chat_app import wait_for

PASTE_GAP = 0.001  # a terminal reads a paste's keys this close together
TYPING_GAP = 0.2  # a fast typist's keys


class Unrelated(Message):
    """A message to the app that is no key."""


def no_model():
    raise OSError("no model in these tests")  # the box needs none


def timed_keys(text: str, gap: float, start: float = 1000.0) -> list[events.Key]:
    """Keys for `text` (a line break as Enter) read `gap` seconds apart."""
    keys = [
        events.Key("enter", "\r") if c == "\n" else events.Key("space" if c == " " else c, c)
        for c in text
    ]
    for number, key in enumerate(keys):
        key.time = start + number * gap
    return keys


def terminal_keys(data: str) -> list[events.Key]:
    """What Textual's parser makes of the bytes a terminal sends."""
    return [event for event in XTermParser().feed(data) if isinstance(event, events.Key)]


async def test_ctrl_g_edits_from_the_end_and_option_arrows_move_by_word(make_app):
    app = make_app(loader=no_model)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        app.chats.store.add_message(screen.current, "user", "first line\nand one two three")
        await pilot.press("ctrl+g")
        box = screen.message_box
        assert box.text == "first line\nand one two three"
        assert box.cursor_location == (1, len("and one two three"))

        for data, where in [("\x1bb", (1, 12)), ("\x1bb", (1, 8)), ("\x1bf", (1, 11))]:
            for key in terminal_keys(data):  # Option+Left, Option+Left, Option+Right
                app.post_message(key)
            await wait_for(pilot, lambda where=where: box.cursor_location == where)
        assert box.text == "first line\nand one two three"  # nothing typed
        assert screen.editing is not None  # and Esc was not seen: still editing


async def test_a_pasted_enter_is_a_line_break_and_a_typed_one_sends(make_app):
    app = make_app(loader=no_model)
    async with app.run_test(size=(80, 24)) as pilot:
        box = app.screen.message_box
        sent: list[str] = []

        async def record(text: str) -> None:
            sent.append(text)
            box.clear()

        box.on_submit = record
        paste = "one\ntwo\n\nthree"
        for key in timed_keys(paste, PASTE_GAP):  # all at once, as the terminal read them
            app.post_message(key)
        await wait_for(pilot, lambda: box.text == paste)
        assert sent == []

        box.clear()
        for key in timed_keys("hi\nok", TYPING_GAP, start=2000.0):  # typed ahead, not pasted
            app.post_message(key)
        await wait_for(pilot, lambda: box.text == "ok")
        assert sent == ["hi"]

        for key in timed_keys("\n", PASTE_GAP, start=2000.0 + 4 * TYPING_GAP + PASTE_GAP):
            app.post_message(key)  # an Enter right behind a letter, and nothing behind it
        await wait_for(pilot, lambda: sent == ["hi", "ok"])

        for key in timed_keys("yes\n", PASTE_GAP, start=3000.0):
            app.post_message(key)
        app.post_message(Unrelated())  # waiting behind the Enter, and no key: it sends, later
        await wait_for(pilot, lambda: sent == ["hi", "ok", "yes"])
