"""Where the user writes: Enter sends, Ctrl+J (or Shift+Enter where the terminal reports it)
starts a new line. PageUp / PageDown (and Home / End while the box is empty, ctrl+home / ctrl+end
always) scroll the open chat's transcript, so reading back never takes the focus from the box.

Every key is handled here, in the order typed, to the end. Textual inserts a printable key as
soon as the focused widget reads it, but runs a key *binding* (Backspace, End, the arrows,
ctrl+g ...) only after the key has bubbled up to the app through the queue of every ancestor,
and a posted message reaches the screen the same way. Keys that arrive faster than the app
handles them (a fast typist, a terminal catching up after the app was busy switching chats or
finishing a reply) then overtook each other: a Backspace typed before a word deleted the word's
last letter, and Enter sent the text before the edits typed ahead of it. So the prompt runs the
binding of each non-printable key itself, and awaits the screen's `on_submit` for Enter, before
it reads the next key.

Printable keys are inserted in runs: a paste in a terminal without bracketed paste arrives as one
key per character, and inserting each alone re-wrapped the whole growing line every time (20,000
characters took minutes). So a printable key that has more messages waiting behind it (in the
app's queue or this box's) is kept, and the run is inserted at the first key with none behind it,
before anything that acts on the text or the cursor (any other key, a paste, a click), or at
the latest `RUN_WAIT_S` after its first key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

from textual import events
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import TextArea

RUN_WAIT_S = 0.05  # the longest a kept key waits to be shown, when no other key comes

# Where a scroll key takes the transcript.
Scroll = Literal["page_up", "page_down", "home", "end"]


class MessageBox(TextArea):
    """A multi-line input that hands its text to `on_submit` on Enter and its scroll keys to
    `on_scroll`."""

    BINDINGS = [
        Binding("enter", "submit", "Send"),
        Binding("ctrl+j", "newline", "New line"),
        Binding("pageup", "scroll('page_up')", "Scroll the chat up", show=False),
        Binding("pagedown", "scroll('page_down')", "Scroll the chat down", show=False),
        Binding("ctrl+home", "scroll('home')", "Scroll to the chat's start", show=False),
        Binding("ctrl+end", "scroll('end')", "Scroll to the chat's end", show=False),
        Binding("home", "home", "Chat start (empty box), else line start", show=False),
        Binding("end", "end", "Chat end (empty box), else line end", show=False),
    ]

    def __init__(
        self,
        on_submit: Callable[[str], Awaitable[None]],
        on_scroll: Callable[[Scroll], None],
    ) -> None:
        super().__init__(id="prompt", soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.placeholder = "Message (Enter to send, Ctrl+J for a new line)"
        self.on_submit = on_submit
        self.on_scroll = on_scroll
        self._typed: list[str] = []  # printable keys read, not inserted yet
        self._run_timer: Timer | None = None

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character is not None and not self.read_only:
            event.stop()
            event.prevent_default()
            self._typed.append(event.character)
            if not (self.app.message_queue_size or self.message_queue_size):
                self.insert_typed()
            elif self._run_timer is None:
                self._run_timer = self.set_timer(RUN_WAIT_S, self.insert_typed)
            return
        self.insert_typed()
        if event.key == "enter":  # TextArea would insert a newline before bindings are looked at
            event.stop()
            event.prevent_default()
            await self.action_submit()
        elif event.key in ("ctrl+j", "shift+enter"):
            event.stop()
            event.prevent_default()
            self.action_newline()
        elif await self._run_binding(event.key):
            event.stop()
            event.prevent_default()

    def insert_typed(self) -> None:
        """Insert the printable keys read so far, as typing them one by one would."""
        if self._run_timer is not None:
            self._run_timer.stop()
            self._run_timer = None
        if self._typed:
            text = "".join(self._typed)
            self._typed.clear()
            self._replace_via_keyboard(text, *self.selection)

    async def _on_paste(self, event: events.Paste) -> None:
        self.insert_typed()  # then TextArea inserts the paste, after the keys typed before it

    async def _on_mouse_down(self, event: events.MouseDown) -> None:
        self.insert_typed()  # then TextArea moves the cursor

    async def _run_binding(self, key: str) -> bool:
        """Run `key`'s binding now, looked up as the app does once a key has bubbled up to it
        (this box, then the screen, then the app; True when one handled it)."""
        return await self.app._check_bindings(key)

    async def action_submit(self) -> None:
        await self.on_submit(self.text)  # the screen decides: an empty box may carry images

    def action_newline(self) -> None:
        self.insert("\n")

    def action_scroll(self, where: Scroll) -> None:
        self.on_scroll(where)

    def action_home(self) -> None:
        """An empty box has no line to move in: Home goes to the chat's start instead."""
        if self.text:
            self.action_cursor_line_start()
        else:
            self.on_scroll("home")

    def action_end(self) -> None:
        if self.text:
            self.action_cursor_line_end()
        else:
            self.on_scroll("end")

    def start_editing(self, text: str) -> None:
        """Show `text` (a message already sent) marked as being edited, to resend with Enter."""
        self.text = text
        self.border_title = "Editing your last message: Enter resends, Esc cancels"
        self.add_class("-editing")
        self.focus()

    def stop_editing(self) -> None:
        self.clear()
        self.border_title = None
        self.remove_class("-editing")
