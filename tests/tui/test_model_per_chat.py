"""A model per chat (issue 49), driven with Textual's pilot: two tiny models saved in Hugging Face
layout under a --models-dir; the app starts on alpha, a second chat picks beta with `/model`
(loaded on demand while the app stays usable) and the picker (F4). Each reply equals mlx-lm's own
greedy generation on that chat's model; the two chats stream at the same time; the status bar
shows the open chat's model and the memory of each loaded one; the history keeps each chat's
model across a restart; a model that fails to load leaves the app running with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from macbatch.engine import Engine, EngineConfig, EngineThread
from macbatch.session_settings import SessionSettings
from macbatch.tui.app import ChatApp
from macbatch.tui.screens.help import help_rows
from macbatch.tui.store import HistoryStore
from macbatch.tui.widgets.status_bar import StatusBar
from tests.support.chat_app import GREEDY, LONG, mlx_lm_reply, send, wait_for
from tests.support.lora import ATTENTION, MLP, name_base, save_adapter
from tests.support.tiny import save_two_models

CONFIG = EngineConfig(num_blocks=256, max_num_seqs=8)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat-models")
    save_two_models(root)
    # two fine-tunes of alpha beside it, each naming alpha as its trainer wrote it; seeds whose
    # greedy reply to "hello world" has no EOS in LONG's 3000 tokens (seed 2's ends at token 75,
    # too soon for the two replies to be seen streaming together)
    name_base(save_adapter(root / "tune", seed=1, keys=ATTENTION + MLP), "alpha")
    name_base(save_adapter(root / "tune2", seed=3, keys=MLP, rank=8), "someone/alpha")
    return root


def chat_app(home: Path, models_dir: Path, defaults: SessionSettings = GREEDY) -> ChatApp:
    first = models_dir / "alpha"
    engine = EngineThread(lambda: Engine.load(str(first), CONFIG))
    return ChatApp(
        engine,
        HistoryStore(home / "chat.sqlite3"),
        model_label=str(first),
        export_dir=home / "exports",
        defaults=defaults,
        engine_config=CONFIG,
        models_dirs=(models_dir,),
    )


async def reply_to(pilot: Any, app: ChatApp, text: str) -> str:
    """Send ``text`` in the open chat once its model is ready; the whole reply's text."""
    screen = app.screen
    await wait_for(pilot, lambda: app.chats.ready, timeout=60)
    await send(pilot, screen, text)
    await wait_for(pilot, lambda: screen.current not in app.chats.replies)
    return app.chats.store.messages(screen.current)[-1].content


def both_streaming(app: ChatApp, first: int, second: int) -> bool:
    """Both chats' replies are in flight, each past its first 20 characters."""
    replies = app.chats.replies
    if not (first in replies and second in replies):
        return False
    return all(len(replies[s][0].message.content) > 20 for s in (first, second))


def status(app: ChatApp) -> str:
    return str(app.screen.query_one(StatusBar).render())


async def test_each_chat_answers_on_its_model(home: Path, models_dir: Path) -> None:
    app = chat_app(home, models_dir)
    async with app.run_test() as pilot:
        screen = app.screen
        first = screen.current
        assert await reply_to(pilot, app, "hello world") == mlx_lm_reply(
            models_dir / "alpha", "hello world"
        )
        await pilot.press("ctrl+n")
        second = screen.current
        await send(pilot, screen, "/model beta")  # a command: nothing is sent to a model
        assert app.chats.store.messages(second) == []
        assert app.chats.sessions[second].model == "beta"
        assert await reply_to(pilot, app, "hello world") == mlx_lm_reply(
            models_dir / "beta", "hello world"
        )
        bar = status(app)
        assert bar.startswith("beta · ") and " · loaded: alpha " in bar and ", beta " in bar
        await screen.open_session(first)  # the first chat stays on alpha
        assert status(app).startswith("alpha · ")
        assert await reply_to(pilot, app, "the quick brown fox") == mlx_lm_reply(
            models_dir / "alpha", "the quick brown fox"
        )
        assert app.chats.sessions[first].model == str(models_dir / "alpha")  # chat started on

    again = chat_app(home, models_dir)  # the history remembers each chat's model
    async with again.run_test() as pilot:
        await again.screen.open_session(second)
        assert again.chats.model_of(second) == "beta"
        await wait_for(pilot, lambda: again.chats.ready, timeout=60)  # loaded on opening
        assert "beta" in again.chats.models.pool.loaded


async def test_the_picker_switches_the_open_chats_model(home: Path, models_dir: Path) -> None:
    app = chat_app(home, models_dir)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        rows = help_rows(app, app.screen.BINDINGS)  # F1 lists the key and the command
        assert ("Anywhere", "f4", "Pick this chat's model (/model NAME too)") in rows
        assert any(keys == "/model NAME" for _, keys, _ in rows)
        await pilot.press("f4")
        picker = app.screen
        options = picker.query_one("#models")
        names = [options.get_option_at_index(i).id for i in range(options.option_count)]
        assert names[0] == str(models_dir / "alpha")  # the open chat's model first
        assert "beta" in names
        options.highlighted = names.index("beta")
        await pilot.press("enter")
        chat = app.screen.current
        assert app.chats.model_of(chat) == "beta"
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        assert json.dumps(app.chats.store.session(chat).model) == '"beta"'


async def test_two_chats_on_two_models_stream_at_once(home: Path, models_dir: Path) -> None:
    app = chat_app(home, models_dir, defaults=LONG)
    async with app.run_test() as pilot:
        screen = app.screen
        first = screen.current
        await pilot.press("ctrl+n")
        second = screen.current
        await send(pilot, screen, "/model beta")
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        await screen.open_session(first)
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        await send(pilot, screen, "hello world")
        await screen.open_session(second)
        await send(pilot, screen, "hello world")

        # each model's reply grows while the other's does
        await wait_for(pilot, lambda: both_streaming(app, first, second))
        engines = {app.chats.held[s][0].thread for s in (first, second)}
        assert len(engines) == 2
        app.chats.stop(first)
        app.chats.stop(second)
        await wait_for(pilot, lambda: not app.chats.replies)


async def test_a_model_that_fails_to_load_leaves_the_app_running(
    home: Path, models_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "more" / "broken"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    first = models_dir / "alpha"
    app = ChatApp(
        EngineThread(lambda: Engine.load(str(first), CONFIG)),
        HistoryStore(home / "chat.sqlite3"),
        model_label=str(first),
        export_dir=home / "exports",
        defaults=GREEDY,
        engine_config=CONFIG,
        models_dirs=(models_dir, tmp_path / "more"),
    )
    async with app.run_test() as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        await send(pilot, screen, "/model nothing-here")
        assert app.chats.model_of(screen.current) == str(first)  # refused, with what to do
        assert any("no local model is called 'nothing-here'" in n.message
                   for n in app._notifications)  # fmt: skip
        await send(pilot, screen, "/model broken")
        await wait_for(pilot, lambda: app.chats.load_error is not None, timeout=60)
        assert "cannot load model 'broken'" in app.chats.load_error
        await pilot.pause(0.6)  # a status tick
        assert "model failed to load" in status(app)
        await send(pilot, screen, "/model alpha")  # the app goes on: back to a model that runs
        assert await reply_to(pilot, app, "hello world") == mlx_lm_reply(first, "hello world")


async def test_two_chats_on_two_fine_tunes_of_one_model(home: Path, models_dir: Path) -> None:
    """Two chats on two adapters of alpha, picked with `/model` (loaded into alpha's running
    engine on first use): each reply equals mlx-lm's with that adapter loaded, the two replies
    stream at once in one engine, and the picker lists each fine-tune after its model."""
    app = chat_app(home, models_dir)
    alpha = models_dir / "alpha"
    async with app.run_test() as pilot:
        screen = app.screen
        first = screen.current
        await send(pilot, screen, "/model alpha:tune")
        assert app.chats.sessions[first].model == f"{alpha}:tune"
        assert await reply_to(pilot, app, "hello world") == mlx_lm_reply(
            alpha, "hello world", adapter=models_dir / "tune"
        )
        await pilot.press("ctrl+n")
        second = screen.current
        await send(pilot, screen, "/model tune2")
        assert app.chats.sessions[second].model == f"{alpha}:tune2"
        assert await reply_to(pilot, app, "hello world") == mlx_lm_reply(
            alpha, "hello world", adapter=models_dir / "tune2"
        )
        assert status(app).startswith("alpha:tune2 · ")
        names = app.chats.models.names()
        assert names[names.index(str(alpha)) + 1 :][:2] == [f"{alpha}:tune", f"{alpha}:tune2"]
        assert app.chats.models.describe(f"{alpha}:tune").startswith("loaded, ")
        assert list(app.chats.models.pool.loaded) == [str(alpha)]  # one engine


async def test_two_fine_tunes_stream_at_once_in_one_engine(home: Path, models_dir: Path) -> None:
    app = chat_app(home, models_dir, defaults=LONG)
    async with app.run_test() as pilot:
        screen = app.screen
        first = screen.current
        await send(pilot, screen, "/model alpha:tune")
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        await send(pilot, screen, "hello world")
        await pilot.press("ctrl+n")
        second = screen.current
        await send(pilot, screen, "/model alpha:tune2")
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        await send(pilot, screen, "hello world")

        await wait_for(pilot, lambda: both_streaming(app, first, second))
        held = [app.chats.held[s] for s in (first, second)]
        assert held[0][0] is held[1][0]  # one engine, two adapters
        assert {name for _, name in held} == {f"{models_dir / 'alpha'}:tune{n}" for n in ("", "2")}
        app.chats.stop(first)
        app.chats.stop(second)
        await wait_for(pilot, lambda: not app.chats.replies)
