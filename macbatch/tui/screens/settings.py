"""Dialog: the open session's system prompt and sampling settings, checked before saving.

Its inputs are generated from `SAMPLING_FIELDS`, so a new sampling setting appears here without
an edit to this file. It fits a 60x20 terminal: a setting a line, compact inputs and buttons,
a shorter system prompt box below 30 rows, and a scroll bar for whatever a smaller one cuts (it
used to hide Max tokens and both buttons there)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, Switch, TextArea

from macbatch.session_settings import SAMPLING_FIELDS, SessionSettings, parse_settings
from macbatch.tui.widgets.ordered_input import OrderedInput


class SettingsScreen(ModalScreen[SessionSettings | None]):
    """Returns the new settings, or None when cancelled. ``thinking_default`` is whether the
    model's template thinks when not told; None hides the switch (the template has none)."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save"),
        Binding("escape", "dismiss(None)", "Cancel"),
    ]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]  # app.tcss: the prompt box's height

    def __init__(
        self, title: str, settings: SessionSettings, thinking_default: bool | None = None
    ) -> None:
        super().__init__()
        self.session_title = title
        self.settings = settings
        self.thinking_default = thinking_default

    def compose(self) -> ComposeResult:
        settings = self.settings
        with VerticalScroll(classes="dialog settings"):
            yield Label(f"Settings for {self.session_title}", markup=False)
            yield Label("System prompt")
            yield TextArea(settings.system_prompt, id="system-prompt", soft_wrap=True)
            for field in SAMPLING_FIELDS:
                with Horizontal(classes="setting"):
                    yield Label(field.label)
                    value = field.text(getattr(settings, field.name))
                    yield OrderedInput(value, id=field.input_id, compact=True)
            if self.thinking_default is not None:
                with Horizontal(classes="setting"):
                    yield Label("Thinking")
                    chosen = settings.thinking
                    yield Switch(self.thinking_default if chosen is None else chosen, id="thinking")
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save (ctrl+s)", variant="primary", id="save", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def action_save(self) -> None:
        try:
            settings = parse_settings(
                self.query_one("#system-prompt", TextArea).text,
                {f.name: self.query_one(f"#{f.input_id}", Input).value for f in SAMPLING_FIELDS},
                self._thinking(),
            )
        except ValueError as error:
            self.query_one("#settings-error", Static).update(str(error))
            return
        self.dismiss(settings)

    def _thinking(self) -> bool | None:
        """The switch's choice, or None while it says what the template does by default. With
        no switch shown (no such template, or the model still loading), the chat keeps its own."""
        if self.thinking_default is None:
            return self.settings.thinking
        value = self.query_one("#thinking", Switch).value
        return None if value == self.thinking_default else value

    def on_input_submitted(self) -> None:
        self.action_save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.dismiss(None)
