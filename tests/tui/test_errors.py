"""Engine and model errors reach the user as messages in the UI, never as a traceback."""

from __future__ import annotations

from macbatch.engine import Engine, EngineConfig
from macbatch.tui.store import ERROR
from macbatch.tui.widgets.loading_panel import LoadingPanel
from tests.tui.helpers import wait_for
from tests.tui.test_streaming import send


async def test_a_model_that_fails_to_load_is_reported(make_app, tmp_path):
    missing = tmp_path / "no-such-model"
    app = make_app(loader=lambda: Engine.load(str(missing)))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.load_error is not None)
        await pilot.pause(0.6)  # one status refresh
        screen = app.screen
        panel = screen.query_one(LoadingPanel)
        assert panel.display and panel.has_class("-failed")
        assert str(missing) in str(panel.query_one(".phase").render())
        assert any(str(missing) in str(n.message) for n in app._notifications)
        await send(pilot, screen, "hello")
        assert not screen.replies  # nothing was sent; the app is still running
        assert app.store.messages(screen.current) == []
        assert any("failed to load" in str(n.message) for n in app._notifications)
        assert screen.prompt_input.text == "hello"  # kept for when the user fixes the model


async def test_a_request_the_engine_rejects_is_shown_on_the_reply(make_app):
    # 4 blocks of 16 tokens cannot hold a prompt plus 24 new tokens of a long message.
    app = make_app(config=EngineConfig(num_blocks=4, max_num_seqs=4))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.ready)
        screen = app.screen
        await send(pilot, screen, "the quick brown fox jumps over the lazy dog " * 4)
        await wait_for(pilot, lambda: not screen.replies)
        reply = app.store.messages(screen.current)[-1]
        assert reply.status == ERROR and "KV cache" in (reply.error or "")
        meta = str(screen.transcript(screen.current).views[-1].query_one(".meta").render())
        assert "error:" in meta
        assert any("Reply failed" in str(n.message) for n in app._notifications)
        # The engine is still fine: a short message gets a reply.
        await pilot.press("ctrl+n")
        await send(pilot, screen, "hi")
        await wait_for(pilot, lambda: not screen.replies)
        assert app.store.messages(screen.current)[-1].status != ERROR
