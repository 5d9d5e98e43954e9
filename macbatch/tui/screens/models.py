"""Dialog: the local models, to pick the open chat's (F4, or `/model` without a name)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


class ModelScreen(ModalScreen[str | None]):
    """Rows of (name, label, state), the open chat's model first; returns the name picked, or
    None when cancelled."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("This chat's model (Enter to pick, Esc to cancel)")
            yield OptionList(
                *(Option(f"{label}  ({state})", id=name) for name, label, state in self.rows),
                id="models",
            )

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
