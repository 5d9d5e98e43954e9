"""Model loading progress, and engine or model errors shown in the UI, never as a traceback."""

from __future__ import annotations

import threading

from textual.widgets import ProgressBar

from macbatch.engine import Engine, EngineConfig
from macbatch.session_settings import SessionSettings
from macbatch.tui.loading import LoadProgress, is_hub_id, make_loader
from macbatch.tui.store import DONE, ERROR
from macbatch.tui.widgets.loading_panel import LoadingPanel
from macbatch.tui.widgets.status_bar import StatusBar
from tests.support.chat_app import first_reply, send, wait_for


async def test_a_model_that_fails_to_load_is_reported(make_app, tmp_path):
    missing = tmp_path / "no-such-model"
    app = make_app(loader=lambda: Engine.load(str(missing)))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.load_error is not None)
        screen = app.screen
        panel = screen.query_one(LoadingPanel)
        # the next status refresh shows it (a fixed pause was too short on a busy machine)
        await wait_for(pilot, lambda: panel.has_class("-failed"), timeout=10)
        assert panel.display
        assert str(missing) in str(panel.query_one(".phase").render())
        assert not app._notifications  # the panel says it, once
        await send(pilot, screen, "hello")
        assert not screen.chats.replies  # nothing was sent; the app is still running
        assert app.chats.store.messages(screen.current) == []
        assert any("failed to load" in str(n.message) for n in app._notifications)
        assert screen.message_box.text == "hello"  # kept for when the user fixes the model


async def test_a_message_the_kv_pool_cannot_hold_is_refused_with_why(make_app):
    # 4 blocks of 16 tokens cannot even hold the prompt of a long message: refused before it
    # is stored, with what sets the limit (tests/tui/test_long_messages.py has the rest).
    app = make_app(config=EngineConfig(num_blocks=4, max_num_seqs=4))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await send(pilot, screen, "the quick brown fox jumps over the lazy dog " * 8)
        assert not screen.chats.replies and app.chats.store.messages(screen.current) == []
        (notice,) = [str(n.message) for n in app._notifications if "too long" in str(n.message)]
        assert "too long for the model" in notice and "the whole KV cache pool" in notice
        # The engine is still fine: a short message gets a reply.
        await pilot.press("ctrl+n")
        await send(pilot, screen, "hi")
        await wait_for(pilot, lambda: not screen.chats.replies)
        assert app.chats.store.messages(screen.current)[-1].status != ERROR


async def test_max_tokens_shrinks_to_the_room_left(make_app, tiny_tokenizer):
    """A chat asking for more tokens than the context has left still gets a reply, cut at the
    limit, instead of the engine's "can never fit" error."""
    app = make_app(
        config=EngineConfig(num_blocks=4, max_num_seqs=4),
        defaults=SessionSettings("", 0.0, 1.0, 500),
    )
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hi")
        reply = app.chats.store.messages(screen.current)[-1]
        assert reply.status == DONE, reply.error
        used = len(
            tiny_tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}], add_generation_prompt=True
            )
        )
        assert reply.metrics.tokens <= 4 * 16 - used


async def test_loading_progress_is_shown_until_the_model_is_ready(make_app, tiny_model_path):
    progress = LoadProgress()
    load = make_loader(str(tiny_model_path), EngineConfig(num_blocks=64), progress)
    gate = threading.Event()

    def loader() -> Engine:
        progress.update("downloading tiny-qwen3", 1, 4)  # what the hub download reports
        assert gate.wait(30)
        return load()

    app = make_app(loader=loader, load_progress=progress)
    async with app.run_test() as pilot:
        screen = app.screen
        panel = screen.query_one(LoadingPanel)
        phase = panel.query_one(".phase")
        await wait_for(pilot, lambda: "Downloading tiny-qwen3" in str(phase.render()))
        bar = panel.query_one(ProgressBar)
        assert (bar.progress, bar.total) == (1, 4)
        assert panel.display and "loading" in str(screen.query_one(StatusBar).render())
        gate.set()
        await wait_for(pilot, lambda: app.chats.ready)
        await wait_for(pilot, lambda: not panel.display)
        assert "tok/step" in str(screen.query_one(StatusBar).render())
        assert progress.read().phase == f"loading {tiny_model_path}"


def test_only_owner_slash_name_that_is_not_on_disk_goes_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("mlx-community/Qwen3-0.6B-4bit")
    assert not is_hub_id("demo")
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert not is_hub_id("models/mine")  # a local directory wins
    assert not is_hub_id("./mine")
