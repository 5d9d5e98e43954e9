"""Replies on a real engine: two sessions at once, stop, regenerate, edit and resend."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.store import DONE, STOPPED
from macbatch.tui.widgets.display import displayable
from macbatch.tui.widgets.status_bar import StatusBar
from tests.support.chat_app import (
    GREEDY,
    LONG,
    STEP_SECONDS,
    first_reply,
    greedy_texts,
    send,
    type_ahead,
    wait_for,
)

CODE_PROMPT = "Explain this code:\n\n```python\ndef add(a, b):\n    return a + b\n```"
DOCS_SCREENSHOT = Path(__file__).parents[2] / "docs" / "chat-screenshot.svg"


async def test_two_sessions_stream_in_the_same_engine_steps(make_app, tmp_path):
    app = make_app(defaults=LONG, step_seconds=STEP_SECONDS)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await send(pilot, screen, "hello world")
        await pilot.press("ctrl+n")
        await send(pilot, screen, CODE_PROMPT)
        first, second = screen.chats.sessions
        assert set(screen.chats.replies) == {first, second}
        # Both sessions are marked as generating in the sidebar while both stream.
        items = [screen.session_list.item_for(s) for s in (first, second)]
        assert all(item.has_class("-generating") for item in items)
        outputs = app.chats.engine.outputs
        # Greedy replies start with newlines; wait until the second one shows some text.
        await wait_for(pilot, lambda: len(outputs[1]) >= 20 and outputs[1][-1].text.strip())
        await pilot.pause(0.2)
        app.save_screenshot(str(tmp_path / "two-sessions.svg"))

        await pilot.press("escape")  # stops the open session (the second)
        await pilot.press("ctrl+pageup")
        assert screen.current == first
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.chats.replies)
        assert not any(item.has_class("-generating") for item in items)

        steps = [{out.step for out in outs} for outs in outputs]
        shared = steps[0] & steps[1]
        assert len(shared) >= 10, f"sessions shared only {len(shared)} engine steps"
        for session_id, outs in zip((first, second), outputs):
            reply = app.chats.store.messages(session_id)[-1]
            streamed = "".join(out.new_text for out in outs)
            assert reply.status == STOPPED
            assert reply.content == streamed
            assert reply.metrics is not None and reply.metrics.tokens == len(outs[-1].token_ids)
            view = screen.transcript(session_id).view_for(reply.id)
            assert view.query_one("Markdown").source == displayable(streamed)

    svg = (tmp_path / "two-sessions.svg").read_text()
    assert svg.startswith("<svg") and "● hello world" in svg.replace("&#160;", " ")
    if os.environ.get("MACBATCH_UPDATE_SCREENSHOT"):
        shutil.copy(tmp_path / "two-sessions.svg", DOCS_SCREENSHOT)


def status(screen: ChatScreen) -> str:
    return str(screen.query_one(StatusBar).render())


async def test_stop_frees_kv_blocks_at_once(make_app):
    app = make_app(defaults=LONG, step_seconds=STEP_SECONDS)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await send(pilot, screen, "hello world")
        outputs = app.chats.engine.outputs
        await wait_for(pilot, lambda: len(outputs[0]) >= 40)
        in_use = app.chats.engine.call(lambda engine: engine.stats()).result(timeout=10)
        assert in_use.kv_blocks_used > 0
        pool = app.chats.engine.call(
            lambda engine: (
                engine.kv.pool.num_blocks,
                engine.config.block_size,
                sum(a.nbytes for a in engine.runner.store.arrays()),
            )
        )
        blocks, block_size, nbytes = pool.result(timeout=10)
        # The status bar shows the pool: blocks in use of all of them, the tokens they hold,
        # the memory the page arrays take and how much of it requests and the cache use.
        screen.refresh_status()
        pattern = r"KV (\d+)/(\d+) \(([\d,]+) tok\) ([\d,.]+)/([\d,.]+) MiB"
        shown = re.search(pattern, status(screen))
        assert shown, status(screen)
        assert int(shown[1]) > 0 and int(shown[2]) == blocks
        assert int(shown[3].replace(",", "")) == blocks * block_size
        assert float(shown[5].replace(",", "")) == pytest.approx(nbytes / 2**20, abs=0.05)
        used = float(shown[4].replace(",", ""))  # a few blocks of a tiny model: about 0
        assert used == pytest.approx(in_use.kv_bytes_used / 2**20, abs=0.1)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.chats.replies)
        # The abort was queued before this call, so the engine has freed the blocks by now.
        after = app.chats.engine.call(lambda engine: engine.stats()).result(timeout=10)
        assert after.kv_blocks_used == 0
        assert after.running == 0
        await wait_for(pilot, lambda: f"KV 0/{blocks} (" in status(screen))
        reply = app.chats.store.messages(screen.current)[-1]
        assert reply.status == STOPPED
        assert 40 <= len(outputs[0][-1].token_ids) < LONG.max_tokens
        meta = screen.transcript(screen.current).views[-1].query_one(".meta")
        assert "stopped" in str(meta.render())


async def test_regenerate_streams_a_new_version_of_the_last_reply(make_app, tiny_model_path):
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello world")
        user, old = app.chats.store.messages(screen.current)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not screen.chats.replies)
        messages = app.chats.store.messages(screen.current)
        views = screen.transcript(screen.current).views
    assert [m.id for m in messages][0] == user.id and len(messages) == 2
    new = messages[1]  # in the same place (test_versions.py flips back to the old one)
    assert new.id == old.id and new.role == "assistant" and new.status == DONE
    assert (new.version, new.versions) == (2, 2)
    assert [v.message.id for v in views] == [user.id, new.id]
    (expected,) = greedy_texts(tiny_model_path, [[{"role": "user", "content": "hello world"}]], 24)
    assert old.content == new.content == expected
    assert new.metrics is not None and new.metrics.tokens == GREEDY.max_tokens


async def test_edit_and_resend_the_last_message(make_app, tiny_model_path):
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello world")
        await pilot.press("ctrl+g")
        assert screen.message_box.text == "hello world"
        assert screen.message_box.has_class("-editing")
        screen.message_box.text = ""
        await pilot.press(*"0123")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.chats.replies)
        messages = app.chats.store.messages(screen.current)
        assert not screen.message_box.has_class("-editing")
    assert [(m.role, m.status) for m in messages] == [("user", DONE), ("assistant", DONE)]
    assert messages[0].content == "0123"
    (expected,) = greedy_texts(tiny_model_path, [[{"role": "user", "content": "0123"}]], 24)
    assert messages[1].content == expected


async def test_keys_typed_ahead_edit_and_resend_in_the_order_typed(make_app, tiny_model_path):
    """Edit and resend with every key delivered at once, right after a regenerate and right
    after switching chats twice. Textual runs a binding (Backspace, End, ctrl+g, ctrl+pageup) only
    once the key has bubbled up to the app, but inserts a letter at once; the prompt must not
    let them overtake each other (docs/chat.md, "Typing ahead")."""
    replies = greedy_texts(
        tiny_model_path, [[{"role": "user", "content": text}] for text in ("0123", "4567")], 24
    )
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello world")
        first = screen.current

        async def edit_typed_ahead(text: str, *before: str) -> None:
            replies_so_far = len(app.chats.engine.outputs)
            type_ahead(app, *before, "ctrl+g", "end", *["backspace"] * 30, *text, "enter")
            await wait_for(pilot, lambda: len(app.chats.engine.outputs) > replies_so_far)
            await wait_for(pilot, lambda: not screen.chats.replies)

        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not screen.chats.replies)
        await edit_typed_ahead("0123")
        messages = app.chats.store.messages(first)
        assert [(m.role, m.content) for m in messages] == [
            ("user", "0123"),
            ("assistant", replies[0]),
        ]

        await pilot.press("ctrl+n", "ctrl+n")
        await edit_typed_ahead("4567", "ctrl+pageup", "ctrl+pageup")  # back to the first chat
        assert screen.current == first
        messages = app.chats.store.messages(first)
        assert [(m.role, m.content) for m in messages] == [
            ("user", "4567"),
            ("assistant", replies[1]),
        ]
        assert [
            app.chats.store.messages(other) for other in screen.chats.sessions if other != first
        ] == [
            [],
            [],
        ]


async def test_the_view_follows_the_stream_unless_scrolled_up(make_app):
    app = make_app(defaults=LONG, step_seconds=STEP_SECONDS)
    async with app.run_test(size=(60, 12)) as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await send(pilot, screen, "hello world")
        transcript = screen.transcript(screen.current)
        await wait_for(pilot, lambda: transcript.max_scroll_y > 3)
        assert transcript.scroll_y == transcript.max_scroll_y  # following

        transcript.scroll_to(y=0, animate=False)  # what the wheel or the scrollbar does
        grown = transcript.max_scroll_y + 3
        await wait_for(pilot, lambda: transcript.max_scroll_y > grown)
        assert transcript.scroll_y == 0  # the user's position is kept

        transcript.scroll_end(animate=False)  # back at the bottom: follow again
        grown = transcript.max_scroll_y + 3
        await wait_for(pilot, lambda: transcript.max_scroll_y > grown)
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y, timeout=3)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.chats.replies)
