"""The chat service: sessions, their messages and replies, between the screens and the store.

Screens render and route keys; everything that changes a chat goes through `ChatService`, as
elia's screens go through its ChatsManager. It keeps the store and the sessions in memory in step,
starts and stops replies, exports, and is the one place the TUI talks to the engine threads: one
per model, in ``ChatModels`` (each chat remembers its model; ``engine`` is the open chat's). An
action it refuses raises `ChatRefused` with the sentence to show; a reply's end reaches the screen
as its worker's `StateChanged` message, which `reply_ended` turns into what to show.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from textual.notifications import SeverityLevel
from textual.worker import Worker, WorkerState

from macbatch.engine import EngineThread, PromptInput, thinking_default
from macbatch.models.pool import Loaded, ModelRefused
from macbatch.openai.errors import InvalidRequest
from macbatch.openai.messages import chat_messages
from macbatch.session_settings import SessionSettings
from macbatch.tui.attachments import Attachment, AttachmentError, export_images, read_attachment
from macbatch.tui.chat_models import ChatModels, ModelLoad
from macbatch.tui.context_window import fit_to_context, reply_room
from macbatch.tui.conversation import prompt_messages, title_from, to_markdown
from macbatch.tui.loading import load_failure
from macbatch.tui.reply import Reply, ReplyView
from macbatch.tui.store import ERROR, STREAMING, HistoryStore, Message, ReplyMetrics, Session

if TYPE_CHECKING:
    from textual.widget import Widget

    from macbatch.engine import EngineStats, RequestOutput

ShowReply = Callable[[Message], Awaitable[ReplyView]]
MAX_REASON = 300  # characters of a load error shown
# A fenced Markdown code block (``` or ~~~, an optional language), its body captured.
CODE_BLOCK = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n(.*?)^ {0,3}\1[ \t]*$", re.M | re.S)
ENDED = (WorkerState.SUCCESS, WorkerState.CANCELLED, WorkerState.ERROR)


class ChatRefused(Exception):
    """An action that cannot happen now; the text says why, for a notification."""

    def __init__(self, text: str, severity: SeverityLevel = "information") -> None:
        super().__init__(text)
        self.severity: SeverityLevel = severity


class ReplyEnd(NamedTuple):
    """A reply that ended: its session, and why it failed (None: it did not)."""

    session_id: int
    failure: str | None


class EngineStatus(NamedTuple):
    """What the status bar shows of the engine; `problem` replaces the numbers when set.
    `last_reply`: the numbers of the reply that ended last (its prompt's cached tokens).
    `tokens_per_s`: how fast the replies streaming now generate, together (the last reply's
    speed once none streams; None: no reply yet). `replies`: the chat's replies in flight on
    the engine, which its numbers may not count yet (a reply just started)."""

    stats: EngineStats | None
    problem: str | None
    block_size: int = 0
    last_reply: ReplyMetrics | None = None
    tokens_per_s: float | None = None
    replies: int = 0


class ChatService:
    """Every session of the history and the replies in flight, each chat on its model's engine
    thread."""

    def __init__(
        self,
        models: ChatModels,
        store: HistoryStore,
        *,
        defaults: SessionSettings,
        export_dir: Path,
        start_on_model: bool = False,
    ) -> None:
        self.models = models
        self.start_on_model = start_on_model  # `chat -m MODEL`: open a chat on it at start
        self.store = store
        self.defaults = defaults
        self.export_dir = export_dir
        self.sessions: dict[int, Session] = {s.id: s for s in store.sessions()}
        self.replies: dict[int, tuple[Reply, Worker[None]]] = {}
        # the model each reply in flight runs on, and the name the chat gave it
        self.held: dict[int, tuple[Loaded, str]] = {}
        self.open_id: int | None = None  # the chat on screen
        self.last_reply: ReplyMetrics | None = None  # the numbers of the reply that ended last
        self.context_used: dict[int, int] = {}  # a chat's last prompt and reply, in tokens

    # The engines

    def load(self) -> None:
        """Runs on a worker thread: start the first model's engine thread and wait for it."""
        self.models.first.start()
        self.models.first.wait_ready()

    def loaded(self) -> str | None:
        """The first model is ready; the name it reports (a path or a hub id), when it has
        one."""
        self.models.first_loaded()
        name = self.models.first.info.model_name
        return None if name is None else str(name)

    def failed(self, error: BaseException | None) -> str:
        """Keep why the first model failed to load, on one line; that line."""
        reason = load_failure(self.models.first_name, error)
        reason = reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1] + "…"
        self.models.first_failed(reason)
        return reason

    def model_of(self, session_id: int | None) -> str:
        """The model a chat runs on (a chat from before chats had models: the first)."""
        session = self.sessions.get(session_id) if session_id is not None else None
        return (session.model if session else None) or self.models.first_name

    def model_load(self, session_id: int | None = None) -> ModelLoad:
        """The load of a chat's model (the open chat's by default), as the panel shows it."""
        name = self.model_of(self.open_id if session_id is None else session_id)
        return self.models.loads.setdefault(name, ModelLoad())

    @property
    def ready(self) -> bool:
        """The open chat's model has loaded (its engine may have stopped since)."""
        return self.models.present(self.model_of(self.open_id)) is not None

    @property
    def load_error(self) -> str | None:
        """Why the open chat's model failed to load (None: it did not)."""
        return self.model_load().error

    @property
    def engine(self) -> EngineThread:
        """The open chat's model's engine (the first model's until that one has loaded)."""
        return self._engine_for(self.open_id)

    def _engine_for(self, session_id: int | None) -> EngineThread:
        loaded = self.models.present(self.model_of(session_id))
        return self.models.first if loaded is None else loaded.thread

    def set_model(self, session_id: int, requested: str) -> str:
        """``/model NAME`` or the picker: the chat runs on that model from its next reply,
        loaded now if it is not (the app stays usable); the model's name."""
        self._check_idle(session_id)
        try:
            name = self.models.name_of(requested)
        except ModelRefused as refused:
            raise ChatRefused(refused.message, "error") from None
        self.store.set_session_model(session_id, name)
        self.sessions[session_id].model = name
        self.context_used.pop(session_id, None)  # another model's context
        self.models.try_again(name)
        return name

    def status(self) -> EngineStatus:
        if self.load_error is not None:
            return EngineStatus(None, "model failed to load")
        if not self.ready:
            return EngineStatus(None, "loading")
        engine = self.engine
        problem = None if engine.alive else f"engine stopped: {engine.error}"
        replies = sum(held.thread is engine for held, _ in self.held.values())
        return EngineStatus(
            engine.stats(),
            problem,
            engine.info.block_size,
            self.last_reply,
            self.tokens_per_s(),
            replies,
        )

    def tokens_per_s(self) -> float | None:
        """The replies streaming now: the sum of their decode speeds so far; else the speed of
        the reply that ended last."""
        streaming = [reply.message.metrics for reply, _ in self.replies.values()]
        speeds = [m.tokens_per_s for m in streaming if m is not None and m.tokens_per_s]
        if speeds:
            return sum(speeds)
        return None if self.last_reply is None else self.last_reply.tokens_per_s

    def thinking_default(self) -> bool | None:
        """Whether the model's template thinks when not told (None: no switch, or no model)."""
        if not (self.ready and self.engine.alive):
            return None
        return thinking_default(self.engine.tokenizer)

    def close(self) -> None:
        self.models.close()
        self.store.close()

    # Sessions

    def create(self) -> Session:
        """A new chat with the default settings, titled "Chat <n>" until its first message
        gives it a title, on the model the app started with: it keeps it, so a restart on
        another ``-m`` reopens it on its own."""
        number = max(self.sessions, default=0) + 1
        session = self.store.create_session(f"Chat {number}", self.defaults, self.models.first_name)
        self.sessions[session.id] = session
        return session

    def opened_last(self) -> int:
        """The chat to open at start: the one used last, else the newest; a new one if there
        is none, or if ``chat -m MODEL`` named a model that chat does not run on (it reopened on
        its own model, and ``-m`` was ignored)."""
        session = self.store.reopened()
        on_model = session is not None and session.model in (None, self.models.first_name)
        if session is None or (self.start_on_model and not on_model):
            session = self.create()
        return session.id

    def opened(self, session_id: int) -> None:
        self.open_id = session_id
        self.store.set_last_opened(session_id)
        self.models.ensure_loading(self.model_of(session_id))  # a chat on a model not loaded

    def messages(self, session_id: int) -> list[Message]:
        return self.store.messages(session_id)

    def rename(self, session_id: int, title: str) -> None:
        self.store.rename_session(session_id, title)
        self.sessions[session_id].title = title

    def delete(self, session_id: int) -> int | None:
        """Stop its reply and forget it, messages and all; the chat to open instead, the one
        that takes its place in the list (None: it was the only one)."""
        if session_id in self.replies:
            _, worker = self.replies.pop(session_id)
            worker.cancel()
            self._let_go(session_id)
        position = list(self.sessions).index(session_id)
        self.store.delete_session(session_id)
        del self.sessions[session_id]
        remaining = list(self.sessions)
        return remaining[min(position, len(remaining) - 1)] if remaining else None

    def save_settings(self, session_id: int, settings: SessionSettings) -> None:
        """The chat's new settings; they apply from its next reply."""
        self.store.update_settings(session_id, settings)
        self.sessions[session_id].settings = settings

    def export(self, session_id: int, model: str) -> Path:
        """Write the chat (with `model`, the model it is with) as Markdown; the file's path."""
        session = self.sessions[session_id]
        path = self.export_dir / f"chat-{session.id}.md"
        folder = self.export_dir / f"chat-{session.id}-images"
        try:
            self.export_dir.mkdir(parents=True, exist_ok=True)
            history = self.store.messages(session.id)
            images = {
                m.id: [
                    p.relative_to(self.export_dir) for p in export_images(folder, m.id, m.images)
                ]
                for m in history
                if m.images
            }
            path.write_text(to_markdown(session, history, images, model))
        except OSError as error:
            raise ChatRefused(f"Could not export to {path}: {error}", "error") from error
        return path

    # Messages and replies

    def _check_can_reply(self, session_id: int) -> None:
        """`ChatRefused` unless the chat's engine can take a reply for it now."""
        name = self.model_of(session_id)
        error = self.model_load(session_id).error
        if error is not None:
            raise ChatRefused(f"The model failed to load: {error}", "error")
        loaded = self.models.present(name)
        if loaded is None:
            raise ChatRefused("The model is still loading; try again in a moment.", "warning")
        if not loaded.thread.alive:
            raise ChatRefused(f"The engine stopped: {loaded.thread.error}", "error")
        self._check_idle(session_id)

    def _check_idle(self, session_id: int) -> None:
        if session_id in self.replies:
            raise ChatRefused("This chat is still replying: wait, or press Esc to stop it.")

    def check_images(self) -> None:
        """`ChatRefused` (with why) when the model is known to read no images."""
        if self.ready and self.engine.alive and (reason := self.engine.images_refused()):
            raise ChatRefused(f"Cannot attach an image: {reason}.", "error")

    def attach(self, path_text: str) -> Attachment:
        """The image at a path, read and checked for the next message; refused (with why) for a
        model that cannot read images, or a path that is not a readable image."""
        self.check_images()
        try:
            return read_attachment(path_text)
        except AttachmentError as error:
            raise ChatRefused(str(error), "error") from error

    def send(
        self,
        session_id: int,
        text: str,
        replacing: Message | None = None,
        images: tuple[Attachment, ...] = (),
    ) -> Message:
        """Store the user's message with its images (in place of `replacing` and all after it,
        when editing: it keeps the edited message's images); the first message of a chat also
        titles it unless the user named it."""
        self._check_can_reply(session_id)
        if images and (reason := self._engine_for(session_id).images_refused()):
            raise ChatRefused(f"Cannot send images: {reason}.", "error")
        self._check_fits(session_id, text)
        if replacing is not None:
            images = (*replacing.images, *images)
            self.store.delete_messages_from(session_id, replacing.id)
        if not self.store.messages(session_id):
            title = title_from(text or " ".join(image.name for image in images))
            if self.store.set_automatic_title(session_id, title):
                self.sessions[session_id].title = title
        return self.store.add_message(session_id, "user", text, images=images)

    def _check_fits(self, session_id: int, text: str) -> None:
        """Refuse, before it is stored, a message that cannot fit the model's context even as
        the chat's only turn (with its system prompt and room for a reply): leaving older turns
        out would not help, and the text stays in the box to be shortened."""
        session = self.sessions[session_id]
        settings = session.settings
        alone = [*prompt_messages(session, []), {"role": "user", "content": text}]
        engine = self._engine_for(session_id)
        context = engine.context_limit()
        room = self._reply_room(settings, context)
        tokens = len(engine.encode_prompt(alone, settings.template_kwargs()))
        if tokens + room > context:
            raise ChatRefused(
                f"This message is too long for the model: {tokens:,} tokens, and its context "
                f"holds {context:,} ({engine.info.context_limit_reason}) with {room:,} "
                "kept for the reply. Shorten it (it is still in the box), or shorten the system "
                "prompt (ctrl+s).",
                "error",
            )

    @staticmethod
    def _reply_room(settings: SessionSettings, context: int) -> int:
        return reply_room(settings.sampling_params().max_tokens or context, context)

    def context_meter(self, session_id: int) -> str | None:
        """How much of the model's context the chat's last turn filled (None: no reply yet in
        this run of the app, or no model)."""
        used = self.context_used.get(session_id)
        loaded = self.models.loaded(self.model_of(session_id))
        if used is None or loaded is None:
            return None
        limit = loaded.thread.context_limit()
        return f"context {used:,}/{limit:,} tok ({used / limit:.0%})"

    def search(self, text: str) -> list[tuple[int, int, str]]:
        """ctrl+f: messages of every chat containing `text`, newest first."""
        return self.store.search(text)

    def last_reply_text(self, session_id: int) -> str:
        """What ctrl+l copies: the chat's last reply."""
        replies = [m for m in self.store.messages(session_id) if m.role == "assistant"]
        if not replies or not replies[-1].content:
            raise ChatRefused("No reply to copy yet.")
        return replies[-1].content

    def last_code_block(self, session_id: int) -> str:
        """What ctrl+t copies: the last fenced code block of the last reply, without its fences."""
        blocks = [m.group(2) for m in CODE_BLOCK.finditer(self.last_reply_text(session_id))]
        if not blocks:
            raise ChatRefused("The last reply has no code block.")
        return blocks[-1].removesuffix("\n")

    def message_to_edit(self, session_id: int, message_id: int | None = None) -> Message:
        """The message ctrl+g edits: the one selected (a message of yours), else the last one
        you sent. Resent, it replaces that message and drops everything after it."""
        self._check_idle(session_id)
        users = [m for m in self.store.messages(session_id) if m.role == "user"]
        chosen = [m for m in users if m.id == message_id] or users[-1:]
        if not chosen:
            raise ChatRefused("No message to edit yet.")
        return chosen[0]

    def delete_message(self, session_id: int, message_id: int) -> None:
        """Forget one message of the chat (the model no longer sees it); not while it replies."""
        self._check_idle(session_id)
        self.store.delete_message(message_id)

    async def regenerate(self, session_id: int, show: ShowReply, host: Widget) -> None:
        """ctrl+r: a new version of the last reply, the earlier ones kept to flip back to (a chat
        that ends with the user's message gets its first reply)."""
        self._check_can_reply(session_id)
        history = self.store.messages(session_id)
        if not history:
            raise ChatRefused("Nothing to regenerate yet.")
        last = history.pop() if history[-1].role == "assistant" else None
        prompt = self._prompt(session_id, history)
        message = (
            self.store.add_message(session_id, "assistant", "", STREAMING)
            if last is None
            else self.store.new_version(last)
        )
        await self._reply(session_id, prompt, message, show, host)

    def flip(self, session_id: int, step: int, message_id: int | None = None) -> Message:
        """alt+left / alt+right: show the previous (-1) or next (+1) version of the selected
        reply, else of the chat's last reply; the next turn sends the one shown."""
        self._check_idle(session_id)
        replies = [m for m in self.store.messages(session_id) if m.role == "assistant"]
        chosen = [m for m in replies if m.id == message_id] or replies[-1:]
        if not chosen or chosen[0].versions == 1:
            raise ChatRefused("This reply has one version: ctrl+r regenerates it as another.")
        reply, number = chosen[0], chosen[0].version + step
        if not 1 <= number <= reply.versions:
            end = "first" if step < 0 else "last"
            raise ChatRefused(f"This is the {end} version ({reply.version}/{reply.versions}).")
        return self.store.show_version(reply.id, number)

    async def start_reply(self, session_id: int, show: ShowReply, host: Widget) -> None:
        """Store an empty streaming reply to the chat as it stands, have `show` put it on
        screen, and stream into what it shows, as a worker of `host` (whose `StateChanged`
        messages go to `reply_ended`)."""
        prompt = self._prompt(session_id, self.store.messages(session_id))
        message = self.store.add_message(session_id, "assistant", "", STREAMING)
        await self._reply(session_id, prompt, message, show, host)

    def _prompt(self, session_id: int, history: list[Message]) -> list[dict[str, Any]]:
        try:  # OpenAI image_url parts read and checked by the request layer, as serve does
            return chat_messages(prompt_messages(self.sessions[session_id], history))
        except InvalidRequest as error:
            raise ChatRefused(f"Cannot send this chat: {error}", "error") from error

    async def _reply(
        self,
        session_id: int,
        prompt: list[dict[str, Any]],
        message: Message,
        show: ShowReply,
        host: Widget,
    ) -> None:
        name = self.model_of(session_id)
        held = await self.models.hold(name)  # not unloaded meanwhile
        self._let_go(session_id)
        self.held[session_id] = (held, name)
        view = await show(message)
        settings, engine = self.sessions[session_id].settings, held.thread
        adapter = self.models.adapter_of(name)
        reply = Reply(
            lambda: self._stream(engine, prompt, settings, host, adapter),
            self.store,
            message,
            view,
        )
        worker = host.run_worker(
            reply.run(), name=f"reply {message.id}", group="replies", exit_on_error=False
        )
        self.replies[session_id] = (reply, worker)

    def _stream(
        self,
        engine: EngineThread,
        prompt: list[dict[str, Any]],
        settings: SessionSettings,
        host: Widget,
        adapter: str | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """The chat's engine's stream for a reply (``adapter``: the chat's fine-tune), the
        oldest turns left out if the chat outgrew the context (max_tokens is a cap the engine
        shrinks to the room the chat leaves)."""
        params = settings.sampling_params()
        kwargs = settings.template_kwargs()
        context = engine.context_limit()
        room = self._reply_room(settings, context)
        prompt, left_out = fit_to_context(
            prompt, lambda m: len(engine.encode_prompt(m, kwargs)), context - room
        )
        if left_out:
            host.notify(
                f"The chat is longer than the model's context ({context} tokens): its first"
                f" {left_out} messages were left out of this prompt.",
                timeout=4,
            )
        stream = engine.stream(PromptInput(prompt, kwargs, adapter=adapter), params)
        return cast("AsyncGenerator[RequestOutput, None]", stream)  # it is one; typed as less

    def stop(self, session_id: int) -> None:
        """Esc: stop the chat's reply, if any (leaving its stream frees its KV blocks now)."""
        if session_id in self.replies:
            reply, worker = self.replies[session_id]
            reply.stopped_by_user = True
            worker.cancel()

    def reply_ended(self, worker: Worker[None]) -> ReplyEnd | None:
        """Forget the reply `worker` ran, once it has ended (None: it has not, or it was not a
        reply still kept, such as one of a deleted chat)."""
        if worker.state not in ENDED:
            return None
        for session_id, (reply, running) in list(self.replies.items()):
            if running is worker:
                del self.replies[session_id]
                self._let_go(session_id)
                metrics = reply.message.metrics
                if metrics is not None:
                    self.last_reply = metrics
                    used = (metrics.prompt_tokens or 0) + metrics.tokens
                    self.context_used[session_id] = used
                failure = reply.message.error if reply.message.status == ERROR else None
                if worker.state == WorkerState.ERROR:
                    failure = str(worker.error)
                return ReplyEnd(session_id, failure)
        return None

    def _let_go(self, session_id: int) -> None:
        """The chat's reply no longer holds its model."""
        held = self.held.pop(session_id, None)
        if held is not None:
            self.models.release(*held)

    def interrupt_replies(self) -> None:
        """Quitting mid-reply: keep what streamed so far, marked interrupted."""
        for reply, _ in self.replies.values():
            reply.interrupt()
