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

Such a terminal also sends each line break of a paste as Enter, which sent the paste line by
line. An Enter is a pasted line break when it comes in a burst: a letter just before it and a key
right behind it, each at most `PASTE_GAP_S` apart (the times the terminal's keys were read, not
when they are handled), the next key already waiting when the Enter is handled. Nobody types
that fast; an Enter with nothing waiting behind it (typed, or the last key typed ahead) sends at
once, as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.timer import Timer
from textual.widgets import TextArea

RUN_WAIT_S = 0.05  # the longest a kept key waits to be shown, when no other key comes
PASTE_GAP_S = 0.005  # keys read closer together than this are a paste, not typing

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

    class EnterAlone(Message):
        """No key followed the held Enter (read at ``at``) in time: it sends."""

        def __init__(self, at: float) -> None:
            super().__init__()
            self.at = at

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
        # when the last printable key (or pasted line break) was read
        self._last_printable: float | None = None
        self._held_enter: float | None = None  # an Enter in a burst (when it was read)

    async def _on_key(self, event: events.Key) -> None:
        if self._held_enter is not None:  # a key right behind it: the Enter was a line break
            await self._settle_enter(pasted=event.time - self._held_enter <= PASTE_GAP_S)
        previous = self._last_printable
        self._last_printable = event.time if event.is_printable else None
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
            if self._in_burst(event, previous):
                self._held_enter = event.time
                self._wait_for_key(event.time)
            else:
                await self.action_submit()
        elif event.key in ("ctrl+j", "shift+enter"):
            event.stop()
            event.prevent_default()
            self.action_newline()
        elif await self._run_binding(event.key):
            event.stop()
            event.prevent_default()

    def _in_burst(self, enter: events.Key, previous: float | None) -> bool:
        """Whether ``enter`` may be a pasted line break: a letter read just before it, and more
        messages already waiting behind it (the next key decides)."""
        waiting = self.app.message_queue_size or self.message_queue_size
        return bool(waiting) and previous is not None and enter.time - previous <= PASTE_GAP_S

    async def _settle_enter(self, pasted: bool) -> None:
        """The held Enter is a line break (``pasted``), else it sends now."""
        held, self._held_enter = self._held_enter, None
        if pasted:
            self._typed.append("\n")  # with the paste's run of keys
            self._last_printable = held  # a blank line of the paste is in the burst too
        else:
            await self.action_submit()

    def _wait_for_key(self, enter_at: float) -> None:
        """Give the key behind the held Enter time to come; then it sends, if none did."""
        self.set_timer(RUN_WAIT_S, lambda: self.post_message(self.EnterAlone(enter_at)))

    async def on_message_box_enter_alone(self, message: EnterAlone) -> None:
        if self._held_enter != message.at:
            return  # a key came and settled it
        if self.app.message_queue_size:  # keys may wait there still: they settle it
            self._wait_for_key(message.at)
        else:
            await self._settle_enter(pasted=False)

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
        await self._settle_held()
        self.insert_typed()  # then TextArea inserts the paste, after the keys typed before it

    async def _on_mouse_down(self, event: events.MouseDown) -> None:
        await self._settle_held()
        self.insert_typed()  # then TextArea moves the cursor

    async def _settle_held(self) -> None:
        """Anything but a key after a held Enter: it was typed, and sends."""
        if self._held_enter is not None:
            await self._settle_enter(pasted=False)

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
        """Show `text` (a message already sent) marked as being edited, to resend with Enter;
        the cursor at its end, where an edit most often goes on."""
        self.text = text
        self.move_cursor(self.document.end)
        self.border_title = "Editing your last message: Enter resends, Esc cancels"
        self.add_class("-editing")
        self.focus()

    def stop_editing(self) -> None:
        self.clear()
        self.border_title = None
        self.remove_class("-editing")
