"""The help screen (F1): every key the app answers to, grouped by where it works, and the
commands, mouse actions and the command palette that no binding lists.

Each place is a heading over its keys, and the action column wraps: in a table with a "Where"
column, "Anywhere" filled twenty rows and a 60-column terminal cut every action to 10
characters."""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, ListView, Static

from macbatch.tui.slash_commands import COMMANDS
from macbatch.tui.widgets.message_box import MessageBox
from macbatch.tui.widgets.message_view import MessageView
from macbatch.tui.widgets.transcript import Transcript

# What no binding says: typed commands, the mouse, Textual's own keys.
EXTRA_ROWS = [
    ("Anywhere", "tab, shift+tab", "Move the focus (message box, chat list, transcript, messages)"),
    ("Anywhere", "any letter", "Goes into the message box, wherever the focus is"),
    ("Anywhere", "ctrl+p", "Command palette: change the theme (kept across restarts), quit"),
    *(("Message box", command.usage, command.action) for command in COMMANDS),
    ("Mouse", "click", "Open a chat, select a message, focus the transcript"),
    ("Mouse", "wheel", "Scroll the transcript or the chat list"),
    ("Mouse", "drag, then ctrl+c", "Select text and copy it"),
]


class HelpScreen(ModalScreen[None]):
    """(where, keys, action) rows, shown by where; Esc, q, ? or F1 closes it."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Label("Keys (Esc to close; ↑ ↓ scroll)")
            with VerticalScroll(id="help-keys"):
                yield Static(keys_table(self.rows), id="help-table")

    def on_mount(self) -> None:
        self.query_one("#help-keys").focus()


def keys_table(rows: list[tuple[str, str, str]]) -> Table:
    """Each place's heading, then its keys and actions; the action column wraps to the width."""
    table = Table(box=None, show_header=False, expand=True, padding=(0, 1))
    table.add_column("Keys", no_wrap=True, style="bold")
    table.add_column("Action", ratio=1)
    for place, group in groupby(rows, key=lambda row: row[0]):
        table.add_row(Text(place, style="bold underline"), "", end_section=False)
        for _, keys, action in group:
            table.add_row(keys, action)
        table.add_row("", "")
    return table


def help_rows(app: App[None], screen: list[BindingType]) -> list[tuple[str, str, str]]:
    """One row per action and where it works, keys as the footer shows them, a place's rows
    together; `screen` is the chat screen's bindings."""
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
    order = [place for place, _ in places] + ["Mouse"]
    return sorted(rows + EXTRA_ROWS, key=lambda row: order.index(row[0]))
