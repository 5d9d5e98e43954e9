"""Fixtures for the chat app: a private data directory and apps on a real engine (tiny model)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from macbatch.config import data_dir
from macbatch.engine import Engine, EngineConfig
from macbatch.session_settings import SessionSettings
from macbatch.tui.app import ChatApp
from macbatch.tui.loading import LoadProgress
from macbatch.tui.store import HistoryStore
from tests.support.chat_app import GREEDY, RecordingEngineThread


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MACBATCH_HOME", str(tmp_path / "home"))
    return data_dir()


def paced(engine: Engine, seconds: float) -> Engine:
    """Make every step take at least `seconds`, so a long reply is still streaming when the test
    acts on it however fast the engine is (the tiny model runs thousands of tokens a second)."""
    step = engine.step

    def paced_step():
        time.sleep(seconds)
        return step()

    engine.step = paced_step
    return engine


@pytest.fixture
def make_app(tiny_model_path: Path, home: Path) -> Callable[..., ChatApp]:
    """Build a ChatApp on a fresh engine thread (not started: the app starts it)."""

    def make(
        defaults: SessionSettings = GREEDY,
        config: EngineConfig | None = None,
        loader: Callable[[], Engine] | None = None,
        load_progress: LoadProgress | None = None,
        step_seconds: float = 0.0,
        model_label: str = "tiny",
    ) -> ChatApp:
        engine_config = config or EngineConfig(num_blocks=256, max_num_seqs=8)
        load = loader or (lambda: Engine.load(str(tiny_model_path), engine_config))
        engine = RecordingEngineThread(
            (lambda: paced(load(), step_seconds)) if step_seconds else load
        )
        return ChatApp(
            engine,
            HistoryStore(home / "chat.sqlite3"),
            model_label=model_label,
            export_dir=home / "exports",
            defaults=defaults,
            load_progress=load_progress,
        )

    return make
