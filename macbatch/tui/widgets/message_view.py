"""One chat message: who wrote it, its Markdown body (streamed while generating), and a line of
reply numbers underneath."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TextualMessage
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from macbatch.tui.store import DONE, ERROR, STREAMING, Message
from macbatch.tui.widgets.display import counted, displayable
from macbatch.tui.widgets.reasoning_view import ReasoningView


def describe(message: Message) -> str:
    """The line under a message: token count, time to first token, speed, and how it ended."""
    parts = []
    if message.versions > 1:
        parts.append(f"version {message.version}/{message.versions}")
    if message.metrics is not None:
        metrics = message.metrics
        parts.append(counted(metrics.tokens, "token"))
        if metrics.ttft_s is not None:
            parts.append(f"first token {metrics.ttft_s:.2f} s")
        if metrics.tokens_per_s is not None:
            parts.append(f"{metrics.tokens_per_s:.1f} tok/s")
        if metrics.acceptance_rate is not None and metrics.accepted_length is not None:
            parts.append(
                f"drafts {metrics.acceptance_rate:.0%} accepted, "
                f"{metrics.accepted_length:.1f} tok/step"
            )
    if message.status == STREAMING:
        parts.append("generating…")
    elif message.status != DONE and not (message.status == ERROR and message.error):
        parts.append(message.status)  # an error's text says "error: ..." itself
    if message.error:
        parts.append(f"error: {message.error}")
    return " · ".join(parts)


class MessageView(Vertical, can_focus=True):
    """A message in the transcript; focus it (click or Tab) and press ctrl+c to copy its text
    (a printable key, typed anywhere, goes into the message box)."""

    BINDINGS = [
        Binding("ctrl+c", "copy", "Copy message"),
        Binding("delete", "delete", "Delete message (asks first)"),
    ]

    def __init__(self, message: Message) -> None:
        super().__init__(classes=f"message -{message.role}")
        self.message = message
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Static("You" if self.message.role == "user" else "Assistant", classes="role")
        for image in self.message.images:
            yield Static(image.chip(), classes="attachment", markup=False)
        yield Markdown(displayable(self.message.content))
        yield Static(describe(self.message), classes="meta", markup=False)

    async def show_reasoning(
        self, text: str, tokens: int, seconds: float | None, done: bool
    ) -> None:
        """Show the reply's reasoning above its answer (mounted on first use)."""
        views = self.query(ReasoningView)
        if views:
            view = views.first()
        else:
            view = ReasoningView()
            await self.mount(view, before=self.query_one(Markdown))
        view.show(text, tokens, seconds, done)

    def refresh_meta(self) -> None:
        """Redraw the line of numbers and the status classes from `self.message`."""
        self.query_one(".meta", Static).update(describe(self.message))
        self.set_class(self.message.status == STREAMING, "-streaming")
        self.set_class(self.message.status not in (DONE, STREAMING), "-ended-early")

    async def on_mount(self) -> None:
        self.refresh_meta()
        stored = self.message.reasoning
        if stored is not None and self.message.status != STREAMING:  # from the history
            await self.show_reasoning(stored.text, stored.tokens, stored.seconds, True)

    async def append(self, text: str) -> None:
        """Add streamed text; fragments queue up when rendering cannot keep pace."""
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(Markdown))
        await self._stream.write(displayable(text))

    async def finish(self) -> None:
        """End streaming; show exactly the stored text and the final numbers."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        markdown = self.query_one(Markdown)
        shown = displayable(self.message.content)
        if markdown.source != shown:
            await markdown.update(shown)
        self.refresh_meta()

    class DeleteAsked(TextualMessage):
        """Delete was pressed on this message; the screen asks, then deletes it."""

        def __init__(self, view: MessageView) -> None:
            super().__init__()
            self.view = view

    def action_delete(self) -> None:
        self.post_message(self.DeleteAsked(self))

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.message.content)
        self.notify(f"Copied {len(self.message.content)} characters", timeout=2)
