"""The main screen: the session list, the open chat, the message box and the status bar.

It renders and routes keys; what an action does to a chat, the history or the engine is the chat
service's (`macbatch/tui/chats.py`). Every session can have one reply in flight; replies keep
streaming while the user looks at (or types in) another session, and they all share the engine's
steps.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Protocol, cast

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, ListView, TextArea
from textual.worker import Worker

from macbatch.session_settings import SessionSettings
from macbatch.tui.chats import ChatRefused, ChatService
from macbatch.tui.history_file import HistoryBusy
from macbatch.tui.loading import LoadProgress
from macbatch.tui.screens.attach import AttachScreen
from macbatch.tui.screens.confirm import ConfirmScreen
from macbatch.tui.screens.help import HelpScreen, help_rows
from macbatch.tui.screens.models import ModelScreen
from macbatch.tui.screens.rename import RenameScreen
from macbatch.tui.screens.search import SearchScreen
from macbatch.tui.screens.settings import SettingsScreen
from macbatch.tui.slash_commands import command_word, commands_text, find
from macbatch.tui.store import Message
from macbatch.tui.widgets.attachment_chips import AttachmentChips
from macbatch.tui.widgets.display import displayable
from macbatch.tui.widgets.loading_panel import LoadingPanel
from macbatch.tui.widgets.message_box import MessageBox, Scroll
from macbatch.tui.widgets.message_view import MessageView
from macbatch.tui.widgets.session_item import SessionItem
from macbatch.tui.widgets.session_list import SessionList
from macbatch.tui.widgets.status_bar import StatusBar
from macbatch.tui.widgets.transcript import Transcript, Transcripts


class ChatHost(Protocol):
    """What the screen reads of its app (``ChatApp``), named here so the screen need not import
    the app that imports it."""

    chats: ChatService
    model_label: str
    model_requested: str
    load_progress: LoadProgress
    load_started: float


STATUS_EVERY_S = 0.5
NOTHING_CHANGED = "nothing was changed; try again once it is free."
MESSAGE_KEPT = (
    "your message was not sent and is still in the box; press Enter to send it once the "
    "history is free."
)


class ChatScreen(Screen[None]):
    """Sessions, their transcripts and replies; every action acts on the open session."""

    # The footer shows the short description of the keys used most (show=False: F1 only, so the
    # footer fits 140 columns); help shows every key's tooltip, which says what it does.
    # No printable key: typed anywhere, a letter (or ?) goes into the message box.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f1", "help", "Help", tooltip="All keys"),  # first: narrow footers still show it
        Binding("ctrl+n", "new_session", "New", tooltip="New chat"),
        Binding(
            "ctrl+pageup,alt+up", "switch(-1)", "Prev", key_display="^pgup", tooltip="Previous chat"
        ),
        Binding(
            "ctrl+pagedown,alt+down", "switch(1)", "Next", key_display="^pgdn", tooltip="Next chat"
        ),
        Binding(
            "escape",
            "stop",
            "Stop",
            tooltip="Stop the reply, or leave edit mode; back to the message box",
        ),
        Binding(
            "ctrl+r",
            "regenerate",
            "Regen",
            tooltip="Regenerate the last reply (the earlier versions are kept)",
        ),
        Binding(
            "alt+left",
            "flip(-1)",
            "Older",
            show=False,
            tooltip="Previous version of the selected (else last) reply; the next turn sends the "
            "one shown",
        ),
        Binding(
            "alt+right",
            "flip(1)",
            "Newer",
            show=False,
            tooltip="Next version of the selected (else last) reply; the next turn sends the one "
            "shown",
        ),
        Binding(
            "ctrl+g",
            "edit_last",
            "Edit",
            tooltip="Edit and resend your selected (else last) message",
        ),
        Binding("ctrl+s", "settings", "Settings", tooltip="This chat's system prompt and sampling"),
        Binding("ctrl+o", "export", "Export", show=False, tooltip="Export the chat to Markdown"),
        Binding(
            "f3", "attach", "Attach", show=False, tooltip="Attach an image to the next message"
        ),
        Binding("f2", "rename", "Rename", show=False, tooltip="Rename the chat"),
        Binding("f8", "delete", "Delete", show=False, tooltip="Delete the chat (asks first)"),
        Binding("ctrl+l", "copy_reply", "Copy", show=False, tooltip="Copy the last reply"),
        Binding(
            "ctrl+t",
            "copy_code",
            "Code",
            show=False,
            tooltip="Copy the last reply's last code block",
        ),
        Binding("f9", "toggle_sidebar", "Chats", show=False, tooltip="Hide or show the chat list"),
        Binding("f4", "pick_model", "Model", tooltip="Pick this chat's model (/model NAME too)"),
        Binding("ctrl+f", "search", "Search", tooltip="Search every chat's messages"),
    ]
    # Below 90 columns the chat list takes less of the width (app.tcss).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (90, "-wide")]

    def __init__(self) -> None:
        super().__init__()
        self.current: int | None = None
        self.kept_said: str | None = None  # saves a lock holds back, as the notice said them
        self.editing: Message | None = None  # the user message being edited, if any

    @property
    def chat_app(self) -> ChatHost:
        return cast(ChatHost, self.app)

    @property
    def chats(self) -> ChatService:
        return self.chat_app.chats

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield SessionList(id="sessions")
            with Vertical(id="chat"):
                yield LoadingPanel(id="loading")
                yield Transcripts(id="transcripts")
                yield AttachmentChips()
                yield MessageBox(on_submit=self.send, on_scroll=self.scroll_transcript)
        yield StatusBar(id="status")
        yield Footer(compact=True, show_command_palette=False)

    async def on_mount(self) -> None:
        first = self.chats.opened_last()
        items = [SessionItem(s.id, s.title) for s in self.chats.sessions.values()]
        await self.session_list.extend(items)
        await self.open_session(first)
        self.message_box.focus()
        self.refresh_status()
        self.set_interval(STATUS_EVERY_S, self.refresh_status)
        self.set_interval(STATUS_EVERY_S, self.watch_kept_saves)

    @property
    def session_list(self) -> SessionList:
        return self.query_one(SessionList)

    @property
    def message_box(self) -> MessageBox:
        return self.query_one(MessageBox)

    @property
    def chips(self) -> AttachmentChips:
        return self.query_one(AttachmentChips)

    @property
    def transcripts(self) -> Transcripts:
        return self.query_one(Transcripts)

    def transcript(self, session_id: int) -> Transcript:
        return self.transcripts.transcript(session_id)

    def scroll_transcript(self, where: Scroll) -> None:
        if self.current is not None:
            self.transcript(self.current).scroll_by_key(where)

    def steer(self, key: events.Key) -> None:
        """Before a key reaches the focused widget: a printable one typed while a message, the
        transcript or the chat list has the focus belongs in the message box. The app calls this
        for each key in the order typed, and the focus moves at once, so no key is lost and
        none overtakes another."""
        if key.is_printable and not isinstance(self.focused, (TextArea, Input)):
            self.set_focus(self.message_box)

    @contextmanager
    def refusals_shown(self, kept: str = NOTHING_CHANGED) -> Iterator[None]:
        """Around an action: when the service refuses it, or another process holds the history
        (``kept`` says what became of the action then), say why instead."""
        try:
            yield
        except ChatRefused as refusal:
            self.notify(str(refusal), severity=refusal.severity)
        except HistoryBusy as busy:
            self.notify(f"The history is locked by {busy.holder}: {kept}", severity="warning")

    def watch_kept_saves(self) -> None:
        """Say once when a lock holds back saves (a reply streamed meanwhile), and when they
        are written."""
        store = self.chats.store
        if store.flush(wait=False) == (self.kept_said is None):
            return
        if self.kept_said is None:
            self.kept_said = f"{store.kept} changes to the history"
            self.notify(
                f"The history is locked by another process: {self.kept_said} wait in memory "
                "and are written once it is free (keep the app open).",
                severity="warning",
            )
        else:
            self.notify(f"The history is free again: {self.kept_said} were written.", timeout=3)
            self.kept_said = None

    def refresh_status(self) -> None:
        """Status bar and loading panel from the open chat's engine's latest numbers, with
        every loaded model's memory."""
        chats = self.chats
        panel = self.query_one(LoadingPanel)
        panel.display = not chats.ready
        if not chats.ready:  # (again, if memory ran short and it unloaded while idle)
            chats.models.ensure_loading(chats.model_of(self.current))
        label, load = self.model_label(self.current), chats.model_load()
        if load.error is not None:
            panel.fail(f"Could not load {label}: {load.error}")
        elif not chats.ready:
            panel.show(load.progress.read(), time.monotonic() - load.started)
        self.query_one(StatusBar).show(label, chats.status(), chats.models.memory_text())

    def model_label(self, session_id: int | None, requested: bool = False) -> str:
        """How a chat's model is shown (``requested``: as the user named it)."""
        name, models = self.chats.model_of(session_id), self.chats.models
        if name != models.first_name:
            return name if requested else models.label(name)
        return self.chat_app.model_requested if requested else self.chat_app.model_label

    # Sessions

    async def open_session(self, session_id: int) -> None:
        """Show `session_id` (mounting its transcript the first time) and highlight it."""
        chats = self.chats
        title, model = chats.sessions[session_id].title, self.model_label(session_id, True)
        await self.transcripts.show(session_id, title, lambda: chats.messages(session_id), model)
        if self.current != session_id:
            self.cancel_edit()
            chats.opened(session_id)
        self.current = session_id
        self.session_list.highlight(session_id)
        self.show_chat_facts(session_id)
        self.refresh_status()  # its model's, now

    def show_chat_facts(self, session_id: int) -> None:
        """On the open chat's border: how full its context is, and its system prompt (what the
        model is told first)."""
        facts = [self.chats.context_meter(session_id)]
        prompt = " ".join(self.chats.sessions[session_id].settings.system_prompt.split())
        facts.append(f"system: {prompt}" if prompt else None)
        self.transcripts.border_subtitle = displayable(" · ".join(f for f in facts if f)) or None

    def show_title(self, session_id: int) -> None:
        title = self.chats.sessions[session_id].title
        self.session_list.item_for(session_id).set_title(title)
        if session_id == self.current:
            self.transcripts.border_title = displayable(title)

    @on(ListView.Highlighted, "#sessions")
    async def session_highlighted(self, event: ListView.Highlighted) -> None:
        if isinstance(event.item, SessionItem) and event.item.session_id != self.current:
            await self.open_session(event.item.session_id)

    @on(ListView.Selected, "#sessions")
    def session_selected(self) -> None:
        self.message_box.focus()

    async def action_new_session(self) -> None:
        session = None
        with self.refusals_shown():
            session = self.chats.create()
        if session is None:
            return
        await self.session_list.append(SessionItem(session.id, session.title))
        await self.open_session(session.id)
        self.message_box.focus()

    async def action_switch(self, step: int) -> None:
        ids = list(self.chats.sessions)
        if self.current is not None and len(ids) > 1:
            index = (ids.index(self.current) + step) % len(ids)
            await self.open_session(ids[index])
        self.message_box.focus()

    def ask(self, dialog: ModalScreen[Any], then: Callable[[int, Any], Awaitable[None]]) -> None:
        """Show `dialog` about the open chat; `then(chat, answer)` runs on a yes, a title or
        settings, if the chat still exists by then (a reply may not wait for the dialog)."""
        session_id = self.current
        if session_id is None:
            return

        async def answered(answer: object) -> None:
            if answer and session_id in self.chats.sessions:
                await then(session_id, answer)

        self.app.push_screen(dialog, answered)

    def action_rename(self) -> None:
        if self.current is not None:
            self.ask(RenameScreen(self.chats.sessions[self.current].title), self.rename)

    async def rename(self, session_id: int, title: str) -> None:
        with self.refusals_shown():
            self.chats.rename(session_id, title)
            self.show_title(session_id)

    def action_delete(self) -> None:
        if self.current is None:
            return
        title = self.chats.sessions[self.current].title
        count = len(self.transcript(self.current).views)
        question = f"Delete {title!r} and its {count} messages?"
        self.ask(ConfirmScreen(question), lambda session_id, _: self.delete_session(session_id))

    async def delete_session(self, session_id: int) -> None:
        """Forget it, take it off the screen, and open a neighbour."""
        try:
            neighbour = self.chats.delete(session_id)
        except HistoryBusy as busy:
            self.notify(f"The history is locked by {busy.holder}: {NOTHING_CHANGED}")
            return
        await self.session_list.item_for(session_id).remove()
        await self.transcript(session_id).remove()
        self.current = None
        if neighbour is None:
            await self.action_new_session()
        else:
            await self.open_session(neighbour)

    def action_settings(self) -> None:
        if self.current is None:
            return
        session = self.chats.sessions[self.current]
        dialog = SettingsScreen(session.title, session.settings, self.chats.thinking_default())
        self.ask(dialog, self.save_settings)

    async def save_settings(self, session_id: int, settings: SessionSettings) -> None:
        with self.refusals_shown():
            self.chats.save_settings(session_id, settings)
        if self.chats.sessions[session_id].settings is not settings:
            return  # refused
        if session_id == self.current:
            self.show_chat_facts(session_id)
        self.notify("Settings saved; they apply to the next reply.", timeout=3)

    def action_export(self) -> None:
        if self.current is not None:
            with self.refusals_shown():
                path = self.chats.export(self.current, self.model_label(self.current))
                self.notify(f"Exported to {path}", timeout=5)

    def action_copy_reply(self) -> None:
        if self.current is not None:
            with self.refusals_shown():
                self.copy(self.chats.last_reply_text(self.current), "the last reply")

    def action_copy_code(self) -> None:
        if self.current is not None:
            with self.refusals_shown():
                self.copy(self.chats.last_code_block(self.current), "its last code block")

    def copy(self, text: str, what: str) -> None:
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied {what} ({len(text)} characters)", timeout=2)

    def action_search(self) -> None:
        titles = {i: s.title for i, s in self.chats.sessions.items()}
        self.app.push_screen(SearchScreen(self.chats.search, titles), self.found)

    async def found(self, hit: tuple[int, int] | None) -> None:
        """Open the chat of the message chosen in the search, and show that message."""
        if hit is not None and hit[0] in self.chats.sessions:
            session_id, message_id = hit
            await self.open_session(session_id)
            view = self.transcript(session_id).view_for(message_id)
            self.call_after_refresh(view.scroll_visible, animate=False, top=True)
        self.message_box.focus()

    def action_toggle_sidebar(self) -> None:
        sidebar = self.session_list
        sidebar.display = not sidebar.display
        if not sidebar.display and sidebar.has_focus:
            self.message_box.focus()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(help_rows(self.app, self.BINDINGS)))

    # Attachments

    def action_attach(self) -> None:
        """F3: the dialog, unless the model is known to read no images (then why, at once)."""
        with self.refusals_shown():
            self.chats.check_images()
            self.app.push_screen(AttachScreen(), self.attach)

    async def attach(self, path: str | None) -> None:
        """F3's dialog or `/image PATH`: a chip for the image, sent with the next message."""
        if path is not None:
            with self.refusals_shown():
                self.chips.add(self.chats.attach(path))
        self.message_box.focus()

    def action_pick_model(self) -> None:
        """F4 or `/model`: the local models, the open chat's first; the one picked is its."""
        if self.current is None:
            return
        models = self.chats.models
        current = self.chats.model_of(self.current)
        rows = [(name, models.label(name), models.describe(name)) for name in models.names()]
        rows.sort(key=lambda row: row[0] != current)

        def picked(name: str | None) -> None:
            if name:
                self.choose_model(name)

        self.app.push_screen(ModelScreen(rows), picked)

    def choose_model(self, requested: str) -> None:
        """The open chat runs on `requested` from now on (loading it if it is not)."""
        if self.current is None:
            return
        with self.refusals_shown():
            name = self.chats.set_model(self.current, requested)
            loading = self.chats.models.loaded(name) is None
            label = self.chats.models.label(name)
            self.notify(f"This chat now runs on {label}" + (" (loading…)" if loading else "."))
            self.refresh_status()
            self.show_chat_facts(self.current)
        self.message_box.focus()

    async def slash_command(self, text: str) -> bool:
        """Run `text` if it is a command (`slash_commands.py`); False: it is a message. An
        unknown command is said, and stays in the box to be corrected."""
        word = command_word(text)
        if word is None:
            return False
        command, argument = find(word[0]), word[1]
        if command is None:
            self.notify(
                f"Unknown command {word[0]}; nothing was sent. The commands:\n{commands_text()}",
                severity="warning",
                timeout=10,
            )
            return True
        name = command.names[0]
        if name == "/image":
            await self.attach(argument)
        elif name == "/model" and argument:
            self.choose_model(argument)
        elif name == "/model":
            self.action_pick_model()
        elif name == "/detach":
            self.chips.clear()
        else:
            self.notify(commands_text(), title="Commands (F1: every key)", timeout=10)
        self.message_box.clear()
        return True

    # Messages and replies

    async def send(self, text: str) -> None:
        """Enter in the message box (the box awaits this before it reads the next key)."""
        session_id, editing = self.current, self.editing
        if not (text.strip() or self.chips.attached):
            return  # nothing to send
        if session_id is None or await self.slash_command(text):
            return
        with self.refusals_shown(MESSAGE_KEPT):
            message = self.chats.send(session_id, text, editing, tuple(self.chips.attached))
            self.chips.clear()
            self.cancel_edit()
            self.message_box.clear()
            transcript = self.transcript(session_id)
            if editing is not None:
                await transcript.remove_from(editing.id)
            await transcript.add(message)
            self.show_title(session_id)
            await self.start_reply(session_id)

    async def start_reply(self, session_id: int) -> None:
        await self.chats.start_reply(session_id, self.transcript(session_id).add, self)
        self.replying(session_id)

    def replying(self, session_id: int) -> None:
        """A reply of the chat has started: mark it in the list, and show it in the bar now."""
        self.session_list.item_for(session_id).generating = True
        self.refresh_status()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        ended = self.chats.reply_ended(event.worker)
        if ended is None:
            return
        self.session_list.item_for(ended.session_id).generating = False
        self.refresh_status()  # now, not at the next tick: the bar follows the reply's end
        if ended.session_id == self.current:
            self.show_chat_facts(ended.session_id)
        if ended.failure is not None:
            self.notify(f"Reply failed: {ended.failure}", severity="error")

    def action_stop(self) -> None:
        """Esc: stop the open chat's reply (its KV blocks are freed now), or leave edit mode;
        either way the focus goes back to the message box."""
        self.message_box.focus()
        if self.editing is not None:
            self.cancel_edit()
        elif self.current is not None:
            self.chats.stop(self.current)

    async def action_regenerate(self) -> None:
        session_id = self.current
        if session_id is None:
            return
        transcript = self.transcript(session_id)

        async def show(message: Message) -> MessageView:  # in place of the version it follows
            await transcript.remove_from(message.id)
            return await transcript.add(message)

        with self.refusals_shown():
            await self.chats.regenerate(session_id, show, self)
            self.replying(session_id)

    async def action_flip(self, step: int) -> None:
        """alt+left / alt+right: the selected reply's (else the last reply's) other versions."""
        session_id = self.current
        if session_id is not None:
            with self.refusals_shown():
                focused = self.focused
                selected = focused.message.id if isinstance(focused, MessageView) else None
                shown = self.chats.flip(session_id, step, selected)
                await self.transcript(session_id).replace(shown)

    def action_edit_last(self) -> None:
        """ctrl+g: edit the selected message of yours, else your last one."""
        if self.current is not None:
            with self.refusals_shown():
                focused = self.focused
                selected = focused.message.id if isinstance(focused, MessageView) else None
                self.editing = self.chats.message_to_edit(self.current, selected)
                self.message_box.start_editing(self.editing.content)

    def on_message_view_delete_asked(self, event: MessageView.DeleteAsked) -> None:
        """Delete on a selected message: ask, then forget it and take it off the screen."""
        view = event.view
        session_id, message = self.current, view.message
        if session_id is None or message.session_id != session_id:
            return

        async def forget(chat: int, _: object) -> None:
            with self.refusals_shown():
                self.chats.delete_message(chat, message.id)
                await view.remove()

        what = "your message" if message.role == "user" else "this reply"
        self.ask(ConfirmScreen(f"Delete {what}? The model will no longer see it."), forget)

    def cancel_edit(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.message_box.stop_editing()

    def on_unmount(self) -> None:
        self.chats.interrupt_replies()
