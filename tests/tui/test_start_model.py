"""Which chat opens at start, on which model (issue 65, item 6). `chat -m MODEL` opens a chat on
MODEL even when the chat used last runs on another (it reopened that one, and -m was ignored); a
model that fails to load says why at once, in the words of what went wrong (a hub model that
cannot be downloaded says so, not a bare ConnectError); a chat on a `--models-dir` model, reopened
without that folder, says its model is not available here and F4 picks another; and the start
line names the model of the chat that opens."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from macbatch.engine import Engine, EngineConfig, EngineThread
from macbatch.tui.app import ChatApp
from macbatch.tui.screens.models import ModelScreen
from macbatch.tui.store import HistoryStore
from macbatch.tui.widgets.loading_panel import LoadingPanel
from tests.support.chat_app import GREEDY, cli, wait_for
from tests.support.tiny import save_two_models

CONFIG = EngineConfig(num_blocks=256, max_num_seqs=8)
HUB_MODEL = "someone/not-downloaded"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("start-models")
    save_two_models(root)
    return root


def a_chat_on(home: Path, model: str) -> int:
    """A history whose chat used last runs on ``model`` (picked with /model); its id."""
    store = HistoryStore(home / "chat.sqlite3")
    chat = store.create_session("On another model", GREEDY)
    store.set_session_model(chat.id, model)
    store.set_last_opened(chat.id)
    store.close()
    return chat.id


def offline() -> Engine:
    """What downloading a hub model does without a network."""
    raise httpx.ConnectError("[Errno -3] Temporary failure in name resolution")


def chat_app(home: Path, first: str, load, models_dirs=(), start_on_model=False) -> ChatApp:
    return ChatApp(
        EngineThread(load),
        HistoryStore(home / "chat.sqlite3"),
        model_label=first,
        export_dir=home / "exports",
        defaults=GREEDY,
        engine_config=CONFIG,
        models_dirs=models_dirs,
        start_on_model=start_on_model,
    )


def panel_text(app: ChatApp) -> str:
    return str(app.screen.query_one(LoadingPanel).query_one(".phase").render())


async def test_dash_m_opens_a_chat_on_its_model_and_a_failed_load_says_why(home, models_dir):
    on_beta = a_chat_on(home, "beta")
    app = chat_app(home, HUB_MODEL, offline, (models_dir,), start_on_model=True)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert screen.current != on_beta
        assert app.chats.store.session(screen.current).model == HUB_MODEL  # kept with it
        assert on_beta in app.chats.sessions  # kept, on its own model
        await wait_for(pilot, lambda: app.chats.load_error is not None)
        await wait_for(pilot, lambda: "Could not load" in panel_text(app), timeout=10)
        said = f"Could not load {HUB_MODEL}: could not download it from the Hugging Face hub"
        assert panel_text(app).startswith(f"{said} (ConnectError: [Errno -3] Temporary")


async def test_a_chat_on_a_folder_reopens_on_it_and_the_first_models_failure_is_said(
    home, models_dir
):
    alpha = str(models_dir / "alpha")
    on_alpha = a_chat_on(home, alpha)  # made by `chat -m FOLDER`, which it keeps
    app = chat_app(home, HUB_MODEL, offline)  # no -m: the chat used last, on its own model
    async with app.run_test(size=(120, 30)) as pilot:
        assert app.screen.current == on_alpha
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)  # loaded from its folder
        said = f"Could not load {HUB_MODEL}: could not download it from the Hugging Face hub"
        await wait_for(pilot, lambda: any(said in n.message for n in app._notifications))


async def test_a_chat_whose_model_is_gone_says_so_and_f4_picks_another(home, models_dir):
    on_beta = a_chat_on(home, "beta")  # beta was under a --models-dir this run is not given
    alpha = str(models_dir / "alpha")
    app = chat_app(home, alpha, lambda: Engine.load(alpha, CONFIG))
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert screen.current == on_beta
        await wait_for(pilot, lambda: app.chats.load_error is not None, timeout=60)
        await wait_for(pilot, lambda: "Could not load" in panel_text(app), timeout=10)
        assert panel_text(app).startswith("Could not load beta: it is not available in this run")
        assert "F4" in panel_text(app)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelScreen))
        options = app.screen.query_one("#models")
        names = [options.get_option_at_index(i).id for i in range(options.option_count)]
        assert "beta" not in names
        options.highlighted = names.index(alpha)
        await pilot.press("enter")
        assert app.chats.model_of(on_beta) == alpha
        # ready to answer (test_model_per_chat.py holds its replies to mlx-lm's)
        await wait_for(pilot, lambda: app.chats.ready, timeout=60)
        assert app.chats.load_error is None
        panel = app.screen.query_one(LoadingPanel)
        await wait_for(pilot, lambda: not panel.display, timeout=10)  # the next status tick


def test_the_start_line_names_the_model_of_the_chat_that_opens(home):
    a_chat_on(home, "beta")
    history = str(home / "chat.sqlite3")
    reopened = CliRunner().invoke(cli(), ["chat", "--history", history])
    assert "Starting macbatch chat with beta…" in reopened.output
    named = CliRunner().invoke(cli(), ["chat", "-m", "demo", "--history", history])
    assert "Starting macbatch chat with demo…" in named.output
    assert reopened.exit_code == named.exit_code == 2  # no terminal here: refused after it
    assert len(HistoryStore(home / "chat.sqlite3").sessions()) == 1  # the command made none
