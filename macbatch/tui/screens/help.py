"""The help screen (F1): every key the app answers to, by where it works, and the commands,
mouse actions and the command palette that no binding lists."""

from __future__ import annotations

from dataclasses import replace

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, ListView

from macbatch.tui.widgets.message_box import MessageBox
from macbatch.tui.widgets.message_view import MessageView
from macbatch.tui.widgets.transcript import Transcript

# What no binding says: typed commands, the mouse, Textual's own keys.
EXTRA_ROWS = [
    ("Anywhere", "tab, shift+tab", "Move the focus (message box, chat list, transcript, messages)"),
    ("Anywhere", "any letter", "Goes into the message box, wherever the focus is"),
    ("Anywhere", "ctrl+p", "Command palette: change the theme (kept across restarts), quit"),
    ("Message box", "/image PATH", "Attach an image to the next message (like F3)"),
    ("Message box", "/detach", "Drop the attached images"),
    ("Message box", "/model NAME", "Run this chat on another local model (like F4)"),
    ("Mouse", "click", "Open a chat, select a message, focus the transcript"),
    ("Mouse", "wheel", "Scroll the transcript or the chat list"),
    ("Mouse", "drag, then ctrl+c", "Select text and copy it"),
]


class HelpScreen(ModalScreen[None]):
    """A table of (where, keys, action) rows; Esc, q, ? or F1 closes it."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Label("Keys (Esc to close)")
            yield DataTable(zebra_stripes=True, cursor_type="row")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Where", "Keys", "Action")
        table.add_rows(self.rows)
        table.focus()


def help_rows(app: App[None], screen: list[BindingType]) -> list[tuple[str, str, str]]:
    """One row per action and where it works, keys as the footer shows them; `screen` is the
    chat screen's bindings."""
    places = [
        ("Anywhere", screen + list(app.BINDINGS)),
        ("Message box", MessageBox.BINDINGS),
        ("Transcript (focused)", Transcript.BINDINGS),
        ("Selected message", MessageView.BINDINGS),
        ("Chat list", ListView.BINDINGS),
    ]
    rows = []
    for place, bindings in places:
        actions: dict[str, tuple[str, list[str]]] = {}
        for binding in Binding.make_bindings(bindings):
            if binding.system and not binding.description:
                continue
            label = binding.tooltip or binding.description  # the tooltip says what it does
            _, keys = actions.setdefault(binding.action, (label, []))
            keys.append(app.get_key_display(replace(binding, key_display=None)))
        rows += [(place, ", ".join(keys), text) for text, keys in actions.values()]
    return rows + EXTRA_ROWS
