"""The settings dialog's thinking switch: shown only for templates that have one, starting at
the template's default, and the choice reaches the engine's chat template."""

from __future__ import annotations

from textual.widgets import Switch

from macbatch.engine import Engine, EngineConfig, PromptInput
from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.store import HistoryStore
from tests.support.chat_app import GREEDY, send, wait_for
from tests.support.tiny import THINKING_TEMPLATE, save_model

CONFIG = EngineConfig(num_blocks=256, max_num_seqs=8)
GREEDY_PARAMS = GREEDY.sampling_params()


async def test_thinking_switch_reaches_the_template(make_app, home, tmp_path):
    path = save_model(tmp_path / "thinking", chat_template=THINKING_TEMPLATE)
    app = make_app(loader=lambda: Engine.load(str(path), CONFIG))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await pilot.press("ctrl+s")
        switch = app.screen.query_one("#thinking", Switch)
        assert switch.value is True  # this template thinks unless told not to
        switch.value = False
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, ChatScreen)
        await send(pilot, screen, "hello world")
        await wait_for(pilot, lambda: not screen.chats.replies)
        session_id = screen.current
    assert HistoryStore(home / "chat.sqlite3").session(session_id).settings.thinking is False
    assert app.chats.engine.template_kwargs == [{"enable_thinking": False}]
    reply = HistoryStore(home / "chat.sqlite3").messages(session_id)[1].content
    oracle = Engine.load(str(path), CONFIG).generate(
        [PromptInput([{"role": "user", "content": "hello world"}], {"enable_thinking": False})],
        GREEDY_PARAMS,
    )[0]
    assert reply == oracle.text


async def test_no_switch_without_one_in_the_template(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        await pilot.press("ctrl+s")
        assert not app.screen.query("#thinking")


async def test_saving_without_the_switch_keeps_the_chats_choice(make_app):
    """With no switch shown (the model still loading, or no such template), saving other
    settings must not wipe a thinking choice the chat already has."""
    from dataclasses import replace

    from macbatch.tui.screens.settings import SettingsScreen

    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        chosen = replace(GREEDY, thinking=False)
        saved = []
        app.push_screen(SettingsScreen("Chat", chosen, thinking_default=None), saved.append)
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: bool(saved))
    assert saved[0] is not None and saved[0].thinking is False
