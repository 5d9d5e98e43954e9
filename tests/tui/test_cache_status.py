"""The status bar shows how much of the last reply's prompt the prefix cache held: nothing on a
new chat's first reply, and, when the reply is regenerated from the same prompt, every full
KV block of it but the one holding its last token (the engine computes at least one)."""

from __future__ import annotations

import re

from macbatch.tui.widgets.status_bar import StatusBar
from tests.support.chat_app import first_reply, wait_for

ASK = "the quick brown fox jumps over the lazy dog " * 8
SHOWN = re.compile(r"last prompt ([\d,]+)/([\d,]+) tok cached")


def _shown(screen) -> tuple[int, int]:
    screen.refresh_status()
    found = SHOWN.search(str(screen.query_one(StatusBar).render()))
    assert found, str(screen.query_one(StatusBar).render())
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))


async def test_status_bar_shows_the_last_prompts_cached_tokens(make_app) -> None:
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, ASK)
        engine = app.chats.engine
        prompt = len(engine.encode_prompt(engine.prompts[-1]))
        assert prompt > 32
        assert _shown(screen) == (0, prompt)
        await pilot.press("ctrl+r")  # the same prompt again
        await wait_for(pilot, lambda: len(engine.prompts) == 2 and not screen.chats.replies)
        assert engine.prompts[-1] == engine.prompts[0]
        block = engine.info.block_size
        assert _shown(screen) == ((prompt - 1) // block * block, prompt)
