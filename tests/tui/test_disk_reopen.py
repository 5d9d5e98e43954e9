"""Reopening ``chat`` on a long conversation reads its history back from the disk tier instead of
computing it: the first app's engine writes the conversation's prompt blocks and is shut down
when the app exits; the next app, over a fresh engine on the same cache directory, answers a
follow-up whose prompt reads from disk every full 16-token block it shares with the last prompt
the first app sent, and the status bar says how many came from disk. The oracle is the two
prompts' tokens (the engine's own encoding of what each app sent)."""

from __future__ import annotations

import re
from pathlib import Path

from macbatch.engine import EngineConfig
from macbatch.tui.widgets.status_bar import StatusBar
from tests.support.chat_app import first_reply, send, wait_for

ASK = "Tell me about the quick brown fox that jumps over the lazy dog. " * 6
SHOWN = re.compile(r"last prompt ([\d,]+)/([\d,]+) tok cached \(([\d,]+) from disk\)")


def _common(a: list[int], b: list[int]) -> int:
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    return same


async def test_reopening_a_chat_reads_its_history_from_disk(make_app, tmp_path: Path) -> None:
    config = EngineConfig(num_blocks=256, max_num_seqs=8, disk_cache_dir=str(tmp_path / "kv"))
    app = make_app(config=config)
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, ASK)
        await send(pilot, screen, "And what did the dog do next, in detail?")
        await wait_for(pilot, lambda: not screen.chats.replies)
        last_sent = app.chats.engine.prompts[-1]
    assert list((tmp_path / "kv").glob("*/*/*.kvb"))

    again = make_app(config=config)
    async with again.run_test() as pilot:
        await wait_for(pilot, lambda: again.chats.ready)
        screen = again.screen
        await send(pilot, screen, "Thanks. One more question about the fox?")
        await wait_for(pilot, lambda: not screen.chats.replies)
        engine = again.chats.engine
        before = engine.encode_prompt(last_sent)
        now = engine.encode_prompt(engine.prompts[-1])
        block = engine.info.block_size
        screen.refresh_status()
        shown = SHOWN.search(str(screen.query_one(StatusBar).render()))
    assert shown, "the status bar does not say how many cached tokens came from disk"
    cached, prompt, from_disk = (int(shown[i].replace(",", "")) for i in (1, 2, 3))
    assert prompt == len(now)
    # what the first app wrote: the last prompt's full blocks; read back: those the new prompt
    # starts with (the one holding its own last token is always computed)
    expected = min(_common(before, now), len(before), len(now) - 1) // block * block
    assert expected >= len(before) // block * block - block  # its whole history, nearly
    assert from_disk == cached == expected
