"""Dialog: search every chat's messages as you type; Enter (or a click) opens the chat of the
chosen message."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from macbatch.tui.widgets.display import displayable
from macbatch.tui.widgets.ordered_input import OrderedInput

# A hit: (chat id, message id, text); what `find` returns for what was typed.
Hit = tuple[int, int, str]
SNIPPET = 70  # characters shown around the match


class SearchScreen(ModalScreen[tuple[int, int] | None]):
    """Returns (chat id, message id) of the chosen message, or None when cancelled. `titles`
    names each chat in the results."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Cancel"),
        Binding("down", "results", "Results", show=False),
    ]

    def __init__(self, find: Callable[[str], list[Hit]], titles: dict[int, str]) -> None:
        super().__init__()
        self.find = find
        self.titles = titles
        self.hits: list[Hit] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog search"):
            yield Label(
                "Search every chat: Enter opens the newest hit, ↓ picks another, Esc cancels"
            )
            yield OrderedInput(placeholder="Text to find", id="search-text")
            yield OptionList(id="search-results")

    def on_input_changed(self, event: Input.Changed) -> None:
        text = event.value.strip()
        self.hits = self.find(text) if text else []
        results = self.query_one(OptionList)
        results.clear_options()
        results.add_options(
            Option(f"{self.titles.get(chat, '?')}: {snippet(content, text)}")
            for chat, _, content in self.hits
        )

    def on_input_submitted(self) -> None:
        if self.hits:
            self.dismiss(self.hits[0][:2])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.hits[event.option_index][:2])

    def action_results(self) -> None:
        """↓ from the search text: into the results, the first one highlighted."""
        results = self.query_one(OptionList)
        if results.option_count:
            results.highlighted = 0
            results.focus()


def snippet(content: str, text: str) -> str:
    """The message on one line, around the first match of `text`."""
    line = displayable(" ".join(content.split()))
    at = max(0, line.lower().find(text.lower()) - SNIPPET // 3)
    cut = line[at : at + SNIPPET]
    return ("…" if at else "") + cut + ("…" if at + SNIPPET < len(line) else "")
