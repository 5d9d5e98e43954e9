"""The main screen: the session list, the open chat, the message box and the status bar.

Every session can have one reply in flight; replies keep streaming while the user looks at (or
types in) another session, and they all share the engine's steps.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, ListView
from textual.worker import Worker, WorkerState

from macbatch.engine import thinking_default
from macbatch.tui.conversation import prompt_messages, title_from, to_markdown
from macbatch.tui.reply import Reply, sampling_params, template_kwargs
from macbatch.tui.screens.confirm import ConfirmScreen
from macbatch.tui.screens.help import HelpScreen
from macbatch.tui.screens.rename import RenameScreen
from macbatch.tui.screens.settings import SettingsScreen
from macbatch.tui.store import ERROR, STREAMING, Message, Session, SessionSettings
from macbatch.tui.widgets.loading_panel import LoadingPanel
from macbatch.tui.widgets.message_view import MessageView
from macbatch.tui.widgets.prompt_input import PromptInput
from macbatch.tui.widgets.session_item import SessionItem
from macbatch.tui.widgets.session_list import SessionList
from macbatch.tui.widgets.status_bar import StatusBar
from macbatch.tui.widgets.transcript import Transcript, transcript_id

if TYPE_CHECKING:
    from macbatch.tui.app import ChatApp

STATUS_EVERY_S = 0.5


class ChatScreen(Screen[None]):
    """Sessions, their transcripts and replies; all actions on the open session live here."""

    BINDINGS: list[BindingType] = [
        Binding("f1,question_mark", "help", "Help"),  # first, so narrow footers still show it
        Binding("ctrl+n", "new_session", "New"),
        Binding("ctrl+pageup,alt+up", "switch(-1)", "Prev", key_display="^pgup"),
        Binding("ctrl+pagedown,alt+down", "switch(1)", "Next", key_display="^pgdn"),
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+r", "regenerate", "Regen"),
        Binding("ctrl+g", "edit_last", "Edit"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+o", "export", "Export"),
        Binding("f2", "rename", "Rename"),
        Binding("f8", "delete", "Delete"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sessions: dict[int, Session] = {}
        self.current: int | None = None
        self.replies: dict[int, tuple[Reply, Worker[None]]] = {}
        self.editing: Message | None = None  # the user message being edited, if any

    @property
    def chat_app(self) -> ChatApp:
        return cast("ChatApp", self.app)

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield SessionList(id="sessions")
            with Vertical(id="chat"):
                yield LoadingPanel(id="loading")
                yield ContentSwitcher(id="transcripts")
                yield PromptInput(on_submit=self.send)
        yield StatusBar(id="status")
        yield Footer(compact=True, show_command_palette=False)

    async def on_mount(self) -> None:
        store = self.chat_app.store
        for session in store.sessions():
            self.sessions[session.id] = session
        if not self.sessions:
            self.create_session()
        items = [SessionItem(s.id, s.title) for s in self.sessions.values()]
        await self.query_one(SessionList).extend(items)
        last = store.last_opened()
        await self.open_session(last if last in self.sessions else max(self.sessions))
        self.query_one(PromptInput).focus()
        self.refresh_status()
        self.set_interval(STATUS_EVERY_S, self.refresh_status)

    # Helpers

    @property
    def session_list(self) -> SessionList:
        return self.query_one(SessionList)

    @property
    def prompt_input(self) -> PromptInput:
        return self.query_one(PromptInput)

    def transcript(self, session_id: int) -> Transcript:
        return self.query_one(f"#{transcript_id(session_id)}", Transcript)

    def refresh_status(self) -> None:
        """Status bar and loading panel from the engine's latest numbers."""
        app = self.chat_app
        panel = self.query_one(LoadingPanel)
        bar = self.query_one(StatusBar)
        if app.load_error is not None:
            panel.display = True
            panel.fail(f"Could not load {app.model_label}: {app.load_error}")
            bar.show(app.model_label, None, "model failed to load")
        elif not app.ready:
            elapsed = time.monotonic() - app.load_started
            panel.show(app.load_progress.read(), elapsed)
            bar.show(app.model_label, None, "loading")
        else:
            panel.display = False
            engine = app.engine
            problem = None if engine.alive else f"engine stopped: {engine.error}"
            bar.show(app.model_label, engine.stats(), problem, engine.info.block_size)

    # Sessions

    async def open_session(self, session_id: int) -> None:
        """Show `session_id` (mounting its transcript the first time) and highlight it."""
        switcher = self.query_one(ContentSwitcher)
        if not switcher.query(f"#{transcript_id(session_id)}"):
            messages = self.chat_app.store.messages(session_id)
            await switcher.mount(Transcript(session_id, messages, self.chat_app.model_requested))
        switcher.current = transcript_id(session_id)
        if self.current != session_id:
            self.cancel_edit()
            self.chat_app.store.set_last_opened(session_id)
        self.current = session_id
        self.session_list.highlight(session_id)
        switcher.border_title = self.sessions[session_id].title

    def create_session(self) -> Session:
        """A new chat with the app's default settings, titled "Chat <n>" until its first message
        gives it a title."""
        number = max(self.sessions, default=0) + 1
        session = self.chat_app.store.create_session(f"Chat {number}", self.chat_app.defaults)
        self.sessions[session.id] = session
        return session

    def show_title(self, session_id: int, title: str) -> None:
        self.sessions[session_id].title = title
        self.session_list.item_for(session_id).set_title(title)
        if session_id == self.current:
            self.query_one(ContentSwitcher).border_title = title

    @on(ListView.Highlighted, "#sessions")
    async def session_highlighted(self, event: ListView.Highlighted) -> None:
        if isinstance(event.item, SessionItem) and event.item.session_id != self.current:
            await self.open_session(event.item.session_id)

    @on(ListView.Selected, "#sessions")
    def session_selected(self) -> None:
        self.prompt_input.focus()

    async def action_new_session(self) -> None:
        session = self.create_session()
        await self.session_list.append(SessionItem(session.id, session.title))
        await self.open_session(session.id)
        self.prompt_input.focus()

    async def action_switch(self, step: int) -> None:
        ids = list(self.sessions)
        if self.current is not None and len(ids) > 1:
            index = (ids.index(self.current) + step) % len(ids)
            await self.open_session(ids[index])

    def action_rename(self) -> None:
        session_id = self.current
        if session_id is None:
            return

        def rename(title: str | None) -> None:
            if title is None or session_id not in self.sessions:
                return
            self.chat_app.store.rename_session(session_id, title)
            self.show_title(session_id, title)

        self.app.push_screen(RenameScreen(self.sessions[session_id].title), rename)

    def action_delete(self) -> None:
        session_id = self.current
        if session_id is None:
            return
        session = self.sessions[session_id]
        count = len(self.transcript(session_id).views)

        async def delete(yes: bool | None) -> None:
            if yes and session_id in self.sessions:
                await self.delete_session(session_id)

        question = f"Delete {session.title!r} and its {count} messages?"
        self.app.push_screen(ConfirmScreen(question), delete)

    async def delete_session(self, session_id: int) -> None:
        """Stop its reply, forget it on disk and on screen, and open a neighbour."""
        if session_id in self.replies:
            _, worker = self.replies.pop(session_id)
            worker.cancel()
        ids = list(self.sessions)
        position = ids.index(session_id)
        self.chat_app.store.delete_session(session_id)
        del self.sessions[session_id]
        await self.session_list.item_for(session_id).remove()
        await self.transcript(session_id).remove()
        self.current = None
        if not self.sessions:
            await self.action_new_session()
        else:
            remaining = list(self.sessions)
            await self.open_session(remaining[min(position, len(remaining) - 1)])

    def action_settings(self) -> None:
        session_id = self.current
        if session_id is None:
            return
        session = self.sessions[session_id]

        def save(settings: SessionSettings | None) -> None:
            if settings is not None and session_id in self.sessions:
                self.chat_app.store.update_settings(session_id, settings)
                self.sessions[session_id].settings = settings
                self.notify("Settings saved; they apply to the next reply.", timeout=3)

        app = self.chat_app
        default = thinking_default(app.engine.tokenizer) if app.ready and app.engine.alive else None
        self.app.push_screen(SettingsScreen(session.title, session.settings, default), save)

    def action_export(self) -> None:
        if self.current is None:
            return
        session = self.sessions[self.current]
        directory = self.chat_app.export_dir
        path = directory / f"chat-{session.id}.md"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(to_markdown(session, self.chat_app.store.messages(session.id)))
        except OSError as error:
            self.notify(f"Could not export to {path}: {error}", severity="error")
            return
        self.notify(f"Exported to {path}", timeout=5)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.help_rows()))

    def help_rows(self) -> list[tuple[str, str, str]]:
        """One row per action and where it works, keys as the footer shows them."""
        places: list[tuple[str, list[BindingType]]] = [
            ("Anywhere", self.BINDINGS + list(self.app.BINDINGS)),
            ("Message box", PromptInput.BINDINGS),
            ("Selected message", MessageView.BINDINGS),
            ("Chat list", ListView.BINDINGS),
        ]
        rows = []
        for place, bindings in places:
            actions: dict[str, tuple[str, list[str]]] = {}
            for binding in Binding.make_bindings(bindings):
                if binding.system and not binding.description:
                    continue
                _, keys = actions.setdefault(binding.action, (binding.description, []))
                keys.append(self.app.get_key_display(replace(binding, key_display=None)))
            rows += [(place, ", ".join(keys), text) for text, keys in actions.values()]
        rows.append(("Anywhere", "tab, shift+tab", "Move focus"))
        return rows

    # Messages and replies

    async def send(self, text: str) -> None:
        """Enter in the message box (the box awaits this before it reads the next key)."""
        session_id = self.current
        if session_id is None or not self.engine_usable():
            return
        if session_id in self.replies:
            self.notify("This chat is still replying: wait, or press Esc to stop it.")
            return
        store = self.chat_app.store
        transcript = self.transcript(session_id)
        editing = self.editing
        self.cancel_edit()
        self.prompt_input.clear()
        if editing is not None:
            store.delete_messages_from(session_id, editing.id)
            await transcript.remove_from(editing.id)
        if not store.messages(session_id):  # the first message names the chat
            title = title_from(text)
            if store.set_automatic_title(session_id, title):
                self.show_title(session_id, title)
        message = store.add_message(session_id, "user", text)
        await transcript.add(message)
        await self.start_reply(session_id)

    def engine_usable(self) -> bool:
        app = self.chat_app
        if app.load_error is not None:
            self.notify(f"The model failed to load: {app.load_error}", severity="error")
            return False
        if not app.ready:
            self.notify("The model is still loading; try again in a moment.", severity="warning")
            return False
        if not app.engine.alive:
            self.notify(f"The engine stopped: {app.engine.error}", severity="error")
            return False
        return True

    async def start_reply(self, session_id: int) -> None:
        """Store an empty streaming reply, show it, and start generating into it."""
        session = self.sessions[session_id]
        store = self.chat_app.store
        prompt = prompt_messages(session, store.messages(session_id))
        message = store.add_message(session_id, "assistant", "", STREAMING)
        view = await self.transcript(session_id).add(message)
        settings = session.settings
        reply = Reply(
            self.chat_app.engine,
            store,
            message,
            view,
            prompt,
            sampling_params(settings),
            template_kwargs(settings),
        )
        worker = self.run_worker(
            reply.run(), name=f"reply {message.id}", group="replies", exit_on_error=False
        )
        self.replies[session_id] = (reply, worker)
        self.session_list.item_for(session_id).generating = True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state not in (WorkerState.SUCCESS, WorkerState.CANCELLED, WorkerState.ERROR):
            return
        for session_id, (reply, worker) in list(self.replies.items()):
            if worker is not event.worker:
                continue
            del self.replies[session_id]
            self.session_list.item_for(session_id).generating = False
            message = reply.message
            if event.state == WorkerState.ERROR:
                self.notify(f"Reply failed: {event.worker.error}", severity="error")
            elif message.status == ERROR:
                self.notify(f"Reply failed: {message.error}", severity="error")

    def action_stop(self) -> None:
        """Esc: stop the open chat's reply (its KV blocks are freed now), or leave edit mode."""
        if self.editing is not None:
            self.cancel_edit()
            return
        entry = self.replies.get(self.current) if self.current is not None else None
        if entry is None:
            return
        reply, worker = entry
        reply.stopped_by_user = True
        worker.cancel()

    async def action_regenerate(self) -> None:
        session_id = self.current
        if session_id is None or not self.engine_usable():
            return
        if session_id in self.replies:
            self.notify("This chat is still replying: press Esc to stop it first.")
            return
        messages = self.chat_app.store.messages(session_id)
        if not messages:
            self.notify("Nothing to regenerate yet.")
            return
        if messages[-1].role == "assistant":
            await self.transcript(session_id).remove_from(messages[-1].id)
            self.chat_app.store.delete_messages_from(session_id, messages[-1].id)
        await self.start_reply(session_id)

    def action_edit_last(self) -> None:
        session_id = self.current
        if session_id is None:
            return
        if session_id in self.replies:
            self.notify("This chat is still replying: press Esc to stop it first.")
            return
        users = [m for m in self.chat_app.store.messages(session_id) if m.role == "user"]
        if not users:
            self.notify("No message to edit yet.")
            return
        self.editing = users[-1]
        prompt = self.prompt_input
        prompt.text = users[-1].content
        prompt.border_title = "Editing your last message: Enter resends, Esc cancels"
        prompt.add_class("-editing")
        prompt.focus()

    def cancel_edit(self) -> None:
        if self.editing is None:
            return
        self.editing = None
        prompt = self.prompt_input
        prompt.clear()
        prompt.border_title = None
        prompt.remove_class("-editing")

    def on_unmount(self) -> None:
        """Quitting mid-reply: keep what streamed so far, marked interrupted."""
        for reply, _ in self.replies.values():
            reply.interrupt()
