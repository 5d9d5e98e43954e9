"""The scrolling list of one session's messages; it follows a streaming reply until the user
scrolls up (Textual's anchor), and follows again once they scroll back to the bottom. The chats
opened so far keep theirs mounted, one shown at a time. It takes the focus (Tab or a click) to
scroll with the arrow keys; the message box scrolls it with PageUp / PageDown too."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import ContentSwitcher

from macbatch.tui.store import Message
from macbatch.tui.widgets.display import displayable
from macbatch.tui.widgets.empty_chat import EmptyChat
from macbatch.tui.widgets.message_box import Scroll
from macbatch.tui.widgets.message_view import MessageView


class Transcript(VerticalScroll, can_focus=True, inherit_bindings=False):
    """All messages of one session, kept mounted while the session streams in the background.
    Its keys are a scroller's up and down ones only: ctrl+pageup / ctrl+pagedown stay the
    screen's (previous / next chat)."""

    BINDINGS = [
        Binding("up", "scroll_up", "Scroll up", show=False),
        Binding("down", "scroll_down", "Scroll down", show=False),
        Binding("pageup", "page_up", "Scroll a page up", show=False),
        Binding("pagedown", "page_down", "Scroll a page down", show=False),
        Binding("home", "scroll_home", "Scroll to the start", show=False),
        Binding("end", "scroll_end", "Scroll to the end", show=False),
    ]

    def __init__(self, session_id: int, messages: list[Message], model: str) -> None:
        super().__init__(id=transcript_id(session_id))
        self.session_id = session_id
        self.model = model
        self._initial = messages

    def compose(self) -> ComposeResult:
        if not self._initial:
            yield EmptyChat(self.model)
        for message in self._initial:
            yield MessageView(message)

    def on_mount(self) -> None:
        self.anchor()

    def scroll_by_key(self, where: Scroll) -> None:
        """The message box's scroll keys; the end follows a streaming reply again."""
        if where == "page_up":
            self.scroll_page_up(animate=False)
        elif where == "page_down":
            self.scroll_page_down(animate=False)
        elif where == "home":
            self.scroll_home(animate=False)
        else:
            self.scroll_end(animate=False)
            self.anchor()

    @property
    def views(self) -> list[MessageView]:
        return list(self.query_children(MessageView))

    def view_for(self, message_id: int) -> MessageView:
        for view in self.views:
            if view.message.id == message_id:
                return view
        raise KeyError(message_id)

    async def add(self, message: Message) -> MessageView:
        """Append a message and follow the bottom again (the user just acted in this chat)."""
        await self.query(EmptyChat).remove()
        view = MessageView(message)
        await self.mount(view)
        self.anchor()
        return view

    async def replace(self, message: Message) -> None:
        """Show `message` in place of its view (another version of a reply)."""
        old = self.view_for(message.id)
        await self.mount(MessageView(message), after=old)
        await old.remove()

    async def remove_from(self, message_id: int) -> None:
        """Drop the message `message_id` and every later one."""
        await self.remove_children([v for v in self.views if v.message.id >= message_id])


class Transcripts(ContentSwitcher):
    """A transcript per chat opened so far: a reply keeps streaming into its own while another
    chat is shown. The border shows the open chat's title."""

    def transcript(self, session_id: int) -> Transcript:
        return self.query_one(f"#{transcript_id(session_id)}", Transcript)

    async def show(
        self, session_id: int, title: str, messages: Callable[[], list[Message]], model: str
    ) -> None:
        """Show the chat's transcript, made from `messages()` the first time."""
        if not self.query(f"#{transcript_id(session_id)}"):
            await self.mount(Transcript(session_id, messages(), model))
        self.current = transcript_id(session_id)
        self.border_title = displayable(title)


def transcript_id(session_id: int) -> str:
    return f"session-{session_id}"
