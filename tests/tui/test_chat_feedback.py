"""What the chat says back at once (issue 65, item 8): `/help` lists the typed commands and an
unknown `/command` is said, neither sent to the model (both were, as messages); a path that starts
a message is text. The status bar counts a reply as running from the moment it starts, before the
engine's next step (it said "0 running" for up to half a second)."""

from __future__ import annotations

import threading

from macbatch.engine import Engine, EngineConfig
from macbatch.tui.slash_commands import COMMANDS, command_word
from macbatch.tui.widgets.status_bar import StatusBar
from tests.support.chat_app import first_reply, send, wait_for


def notices(app) -> list[str]:
    return [notification.message for notification in app._notifications]


async def test_help_and_unknown_commands_are_answered_not_sent(make_app):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        screen = app.screen
        await send(pilot, screen, "/help")
        listing = notices(app)[-1]
        for command in COMMANDS:
            assert command.usage in listing and command.action in listing
        assert screen.message_box.text == ""

        await send(pilot, screen, "/hepl me")
        assert "Unknown command /hepl; nothing was sent" in notices(app)[-1]
        assert screen.message_box.text == "/hepl me"  # kept, to be corrected
        assert app.chats.messages(screen.current) == []
        assert not app.chats.replies and app.chats.engine.outputs == []  # the model saw neither
    assert command_word("/usr/bin/env is where?") is None  # a path: a message


async def test_a_reply_counts_as_running_from_its_start(make_app, tiny_model_path):
    steps = threading.Event()  # the engine's steps wait while it is clear
    steps.set()

    def gated_load() -> Engine:
        engine = Engine.load(str(tiny_model_path), EngineConfig(num_blocks=256, max_num_seqs=8))
        step = engine.step

        def gated_step():
            steps.wait()
            return step()

        engine.step = gated_step
        return engine

    app = make_app(loader=gated_load)
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await first_reply(pilot, app, "hello world")  # the engine has numbers now
        bar = screen.query_one(StatusBar)
        steps.clear()  # the next reply starts, and no step runs: the numbers stay as they were
        try:
            await send(pilot, screen, "and again")
            assert screen.current in app.chats.replies
            assert " · 1 running · 0 waiting · " in str(bar.render())
            screen.refresh_status()  # a tick of the bar's timer: still no step
            assert " · 1 running · " in str(bar.render())
        finally:
            steps.set()
        await wait_for(pilot, lambda: not app.chats.replies)
        screen.refresh_status()
        assert " · 0 running · 0 waiting · " in str(bar.render())
