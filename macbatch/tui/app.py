"""The chat app: owns the engine thread and the history store, and shows `ChatScreen`.

The engine is injected (an `EngineThread` that has not been started) so tests can hand in one
built from a tiny model. The app starts it, loads the model off the UI thread, and shuts it down
on exit.
"""

from __future__ import annotations

import time
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.worker import Worker, WorkerState

from macbatch.engine import EngineThread
from macbatch.tui.loading import LoadProgress
from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.store import HistoryStore, SessionSettings

LOAD_WORKER = "load model"


class ChatApp(App[None]):
    """Several chat sessions on one engine; see docs/chat.md."""

    CSS_PATH = "app.tcss"
    TITLE = "macbatch chat"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(
        self,
        engine: EngineThread,
        store: HistoryStore,
        *,
        model_label: str,
        export_dir: Path,
        defaults: SessionSettings | None = None,
        load_progress: LoadProgress | None = None,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.store = store
        self.model_label = model_label
        self.model_requested = model_label  # as the user named it; model_label follows the load
        self.export_dir = export_dir
        self.defaults = defaults or SessionSettings()
        self.load_progress = load_progress or LoadProgress()
        self.load_started = time.monotonic()
        self.load_error: str | None = None
        self.ready = False

    def on_mount(self) -> None:
        self.push_screen(ChatScreen())
        self.run_worker(self._load, name=LOAD_WORKER, thread=True, exit_on_error=False)

    def _load(self) -> None:
        """Runs on a worker thread: start the engine thread and wait for its model."""
        self.engine.start()
        self.engine.wait_ready()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name != LOAD_WORKER:
            return
        if event.state == WorkerState.SUCCESS:
            self.ready = True
            name = self.engine.info.model_name
            self.model_label = Path(name).name if Path(name).is_dir() else name
            self.notify(f"{self.model_label} is ready.", timeout=3)
        elif event.state == WorkerState.ERROR:
            self.load_error = str(event.worker.error) or type(event.worker.error).__name__
            self.notify(
                f"Could not load {self.model_label}: {self.load_error}",
                severity="error",
                timeout=30,
            )

    def on_unmount(self) -> None:
        self.engine.shutdown()
        self.store.close()
