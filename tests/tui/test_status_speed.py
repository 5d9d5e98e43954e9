"""Live tokens per second in the status bar (issue 50): while replies stream it shows how fast
they generate together (each reply's decode speed as the engine measures it, summed), and once
they end, the speed of the reply that ended last, as stored with it."""

from __future__ import annotations

import re

from macbatch.tui.widgets.status_bar import StatusBar
from tests.support.chat_app import LONG, STEP_SECONDS, send, wait_for


def speed_shown(screen) -> str | None:
    """The tok/s figure of the bar, as shown (None: the bar shows none)."""
    screen.refresh_status()  # now, from the replies' numbers at this moment
    found = re.search(r" · ([0-9.]+) tok/s · ", str(screen.query_one(StatusBar).render()))
    return None if found is None else found.group(1)


def in_flight(app) -> list[float]:
    """Each streaming reply's speed, as its own line of numbers shows it."""
    return [reply.message.metrics.tokens_per_s or 0.0 for reply, _ in app.chats.replies.values()]


async def test_the_status_bar_shows_tokens_per_second_live_and_after(make_app):
    app = make_app(defaults=LONG, step_seconds=STEP_SECONDS)
    streams = app.chats.engine.outputs  # every output the engine streamed, per reply
    most = 1 / STEP_SECONDS  # each step sleeps STEP_SECONDS first: at most this per reply
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        assert speed_shown(screen) is None  # no reply yet: no figure to show

        await send(pilot, screen, "hello world")
        await wait_for(pilot, lambda: len(streams) == 1 and len(streams[0]) > 20)
        shown = speed_shown(screen)
        assert shown == f"{sum(in_flight(app)):.1f}"
        assert 0 < float(shown) <= most

        await pilot.press("ctrl+n")
        await send(pilot, screen, "a second chat")
        await wait_for(pilot, lambda: len(streams) == 2 and len(streams[1]) > 20)
        shown = speed_shown(screen)
        assert len(in_flight(app)) == 2 and shown == f"{sum(in_flight(app)):.1f}"  # together
        assert max(in_flight(app)) < float(shown) <= 2 * most

        await pilot.press("escape", "ctrl+pageup", "escape")  # stop both
        await wait_for(pilot, lambda: not app.chats.replies)
        stored = [
            m.metrics.tokens_per_s
            for chat in app.chats.sessions
            for m in app.chats.store.messages(chat)
            if m.role == "assistant" and m.metrics is not None
        ]
        last = app.chats.last_reply
        assert last is not None and last.tokens_per_s in stored
        assert speed_shown(screen) == f"{last.tokens_per_s:.1f}"  # after: the last reply's
