"""`macbatch chat` on Qwen3.5's real chat template (tests/support/templates), which thinks by
default: two turns, each reply's reasoning kept apart from its answer, and the second reply
equal to the engine's own generation for the same history (the oracle)."""

from __future__ import annotations

from macbatch.engine import Engine, EngineConfig
from macbatch.tui.store import HistoryStore
from tests.support.chat_app import GREEDY, send, wait_for
from tests.support.real_templates import save_with_template

CONFIG = EngineConfig(num_blocks=256, max_num_seqs=8)


async def test_two_turns_on_qwen3_5_reason_by_default(make_app, home, tmp_path):
    path = save_with_template(tmp_path / "qwen3_5", "qwen3_5")
    app = make_app(loader=lambda: Engine.load(str(path), CONFIG))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        for text in ("hello world", "and again"):
            await send(pilot, screen, text)
            await wait_for(pilot, lambda: not screen.chats.replies)
        session_id = screen.current
    messages = HistoryStore(home / "chat.sqlite3").messages(session_id)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    history = [{"role": m.role, "content": m.content} for m in messages[:3]]
    oracle = Engine.load(str(path), CONFIG).generate([history], GREEDY.sampling_params())[0]
    assert oracle.reasoning is not None  # the template opened the reasoning block
    reply = messages[3]
    assert reply.reasoning is not None and reply.reasoning.text == oracle.reasoning
    assert reply.content == oracle.text
