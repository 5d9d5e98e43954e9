"""Where the user writes: Enter sends, Ctrl+J (or Shift+Enter where the terminal reports it)
starts a new line."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    """A multi-line input that posts `Submitted` on Enter."""

    BINDINGS = [
        Binding("enter", "submit", "Send"),
        Binding("ctrl+j", "newline", "Newline"),
    ]

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self) -> None:
        super().__init__(id="prompt", soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.placeholder = "Message (Enter to send, Ctrl+J for a new line)"

    async def _on_key(self, event: events.Key) -> None:
        # TextArea inserts a newline for Enter itself, before bindings are looked at.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
        elif event.key in ("ctrl+j", "shift+enter"):
            event.stop()
            event.prevent_default()
            self.action_newline()
        else:
            await super()._on_key(event)

    def action_submit(self) -> None:
        if self.text.strip():
            self.post_message(self.Submitted(self.text))

    def action_newline(self) -> None:
        self.insert("\n")
