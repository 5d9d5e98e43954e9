"""Model loading progress: a phase line and a bar (counting files while downloading)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from macbatch.tui.loading import LoadState


class LoadingPanel(Vertical):
    """Shown above the chat until the engine is ready; turns into an error box if loading fails."""

    def compose(self) -> ComposeResult:
        yield Static("Starting the engine…", classes="phase", markup=False)
        yield ProgressBar(total=None, show_eta=False, show_percentage=False)

    def show(self, state: LoadState, elapsed_s: float) -> None:
        self.remove_class("-failed")  # another chat's model loading, after one that failed
        self.query_one(".phase", Static).update(f"{state.phase.capitalize()}… {elapsed_s:.0f} s")
        bar = self.query_one(ProgressBar)
        bar.display = True
        bar.update(total=state.total, progress=state.done)
        bar.show_percentage = state.total is not None  # no "--%" while nothing is counted

    def fail(self, message: str) -> None:
        self.add_class("-failed")
        self.query_one(".phase", Static).update(message)
        self.query_one(ProgressBar).display = False
