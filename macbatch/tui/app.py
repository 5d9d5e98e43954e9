"""The chat app: builds the chat service over the engine thread and the history store, loads the
model, and shows `ChatScreen`.

The first model's engine is injected (an `EngineThread` that has not been started) so tests can
hand in one built from a tiny model; ``start_on_model`` (`chat -m MODEL`) opens a chat on it.
The app has the service start it and load the model off the UI thread, and shut it down on
exit; the other models a chat picks load through `ChatModels`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.worker import Worker, WorkerState

from macbatch.engine import EngineConfig, EngineThread
from macbatch.session_settings import SessionSettings
from macbatch.tui.chat_models import ChatModels
from macbatch.tui.chats import ChatService
from macbatch.tui.history_file import HistoryBusy
from macbatch.tui.loading import LoadProgress
from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.store import HistoryStore

LOAD_WORKER = "load model"
THEME_KEY = "theme"


class ChatApp(App[None]):
    """Several chat sessions, each on its model; see docs/chat.md."""

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
        engine_config: EngineConfig | None = None,
        models_dirs: tuple[Path, ...] = (),
        start_on_model: bool = False,
    ) -> None:
        super().__init__()
        self.load_progress = load_progress or LoadProgress()
        # the other models load with the first's settings (engine_config: the command's)
        folders = {s.model for s in store.sessions() if s.model and Path(s.model).is_dir()}
        models = ChatModels(
            engine,
            model_label,
            engine_config or EngineConfig(),
            self.load_progress,
            models_dirs,
            tuple(sorted(folders)),
        )
        self.chats = ChatService(
            models,
            store,
            defaults=defaults or SessionSettings(),
            export_dir=export_dir,
            start_on_model=start_on_model,
        )
        self.model_label = model_label
        self.model_requested = model_label  # as the user named it; model_label follows the load
        self.load_started = time.monotonic()
        self.unwritten: str | None = None  # why the history's last saves were lost at exit

    async def on_event(self, event: events.Event) -> None:
        # A key from the terminal, before it is delivered to the focused widget (bubbled keys
        # come back here forwarded: those were steered already).
        key = isinstance(event, events.Key) and not event.is_forwarded
        if key and isinstance(self.screen, ChatScreen):
            self.screen.steer(cast(events.Key, event))
        await super().on_event(event)

    def on_mount(self) -> None:
        store = self.chats.store
        theme = store.state(THEME_KEY)
        if theme in self.available_themes:  # chosen with ctrl+p, kept across restarts
            self.theme = theme
        self.theme_changed_signal.subscribe(self, lambda t: store.set_state(THEME_KEY, t.name))
        self.push_screen(ChatScreen())
        self.run_worker(self.chats.load, name=LOAD_WORKER, thread=True, exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name != LOAD_WORKER:
            return
        if event.state == WorkerState.SUCCESS:
            name = self.chats.loaded() or self.model_label
            self.model_label = Path(name).name if Path(name).is_dir() else name
            self.notify(f"{self.model_label} is ready.", timeout=3)
        elif event.state == WorkerState.ERROR:
            reason = self.chats.failed(event.worker.error)  # the loading panel says why
            if self.chats.model_of(self.chats.open_id) != self.chats.models.first_name:
                # the chat open runs on another model, whose load the panel shows: say it here
                self.notify(f"Could not load {self.model_label}: {reason}", severity="error")

    def on_unmount(self) -> None:
        try:
            self.chats.close()
        except HistoryBusy as busy:  # the command says it once the terminal is back
            self.unwritten = f"{busy}: the last changes to the history could not be written"
