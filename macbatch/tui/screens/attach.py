"""Dialog: the path of an image to attach to the next message (also `/image PATH`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class AttachScreen(ModalScreen[str | None]):
    """Returns the path typed, or None when cancelled."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Attach an image (Enter to attach, Esc to cancel)")
            yield Input(placeholder="Path to a PNG, JPEG, WebP or GIF file", id="path")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
