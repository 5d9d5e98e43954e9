"""A 20,000-character paste in a terminal without bracketed paste (issue 50): it arrives as one
key event per character, and each used to be inserted alone, re-wrapping the whole growing line
(over four minutes here). The box inserts a run of keys at once; every character arrives, in the
order typed, with the keys typed after it applied after it. The test's run time shows the speed
(a few seconds); it asserts no time."""

from __future__ import annotations

from textual import events

from tests.support.chat_app import wait_for

# The key names a terminal's parser gives these characters.
KEY_NAMES = {" ": "space", ".": "full_stop", ",": "comma", "?": "question_mark"}


def keys_for(text: str) -> list[events.Key]:
    return [events.Key(KEY_NAMES.get(c, c), c) for c in text]


async def test_a_20k_character_paste_as_keys_arrives_intact(make_app, home):
    words = "Lorem ipsum, dolor sit amet 0123 456789. Why? "
    paste = (words * (20_000 // len(words) + 1))[:20_000]
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        box = app.screen.message_box
        edits: list[str] = []
        insert = box._replace_via_keyboard  # every keyboard insert of the box goes through it

        def counted(text: str, *where):  # type: ignore[no-untyped-def]
            edits.append(text)
            return insert(text, *where)

        box._replace_via_keyboard = counted  # type: ignore[method-assign]
        after = ["backspace"] * 5 + ["x", "y", "ctrl+j", "z"]
        for event in keys_for(paste) + [events.Key(k, k if len(k) == 1 else None) for k in after]:
            app.post_message(event)  # all at once, as a terminal delivers a paste
        expected = paste[:-5] + "xy\nz"
        await wait_for(pilot, lambda: box.text == expected, timeout=600)
        assert "".join(edits) == paste + "xyz"  # ctrl+j inserts its new line itself
        assert len(edits) < 200, len(edits)  # runs of keys, not one edit per key
        assert app.chats.messages(app.screen.current) == []  # nothing was sent
