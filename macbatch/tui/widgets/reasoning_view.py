"""A reply's reasoning block (a thinking model's ``<think>`` text): dim and collapsible, open
while the model reasons, collapsed once the answer starts, titled with its tokens and time."""

from __future__ import annotations

from textual.widgets import Collapsible, Static

from macbatch.tui.widgets.display import counted, displayable


def reasoning_title(tokens: int, seconds: float | None, done: bool) -> str:
    timing = "" if seconds is None else f", {seconds:.1f} s"
    return f"{'Reasoned' if done else 'Reasoning…'} ({counted(tokens, 'token')}{timing})"


class ReasoningView(Collapsible):
    """The reasoning text, streamed; ``done`` collapses it (the user may expand it again)."""

    def __init__(self) -> None:
        super().__init__(
            Static("", classes="reasoning-text", markup=False),
            title=reasoning_title(0, None, False),
            collapsed=False,
            classes="reasoning",
        )
        self.done = False

    def show(self, text: str, tokens: int, seconds: float | None, done: bool) -> None:
        self.query_one(".reasoning-text", Static).update(displayable(text))
        self.title = reasoning_title(tokens, seconds, done)
        if done and not self.done:
            self.collapsed = True
        self.done = done
