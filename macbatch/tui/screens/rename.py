"""Dialog: a new title for the open session."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from macbatch.tui.widgets.ordered_input import OrderedInput


class RenameScreen(ModalScreen[str | None]):
    """Returns the new title, or None when cancelled."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.current_title = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Rename chat (Enter to save, Esc to cancel)")
            yield OrderedInput(self.current_title, placeholder="Title", id="title")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        title = event.value.strip()
        if not title:
            self.notify("A chat needs a title.", severity="warning")
            return
        self.dismiss(title)
