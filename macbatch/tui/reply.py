"""One assistant reply in flight: engine outputs go to the message, its view and the store.

The reply runs as a Textual worker on the UI's event loop, reading the stream the chat service
opens on the engine thread (this module never calls the engine itself). Stopping it (Esc)
cancels the worker; leaving the stream aborts the request, which frees its KV blocks on the
engine thread at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from macbatch.engine import EngineDeadError, FinishReason, PromptTooLongError
from macbatch.tui.store import (
    DONE,
    ERROR,
    INTERRUPTED,
    STOPPED,
    HistoryStore,
    Message,
    Reasoning,
    ReplyMetrics,
)

if TYPE_CHECKING:
    from macbatch.engine import RequestOutput

OpenStream = Callable[[], AsyncGenerator["RequestOutput", None]]

SAVE_EVERY_S = 0.5  # how often a streaming reply is written to disk (crash safety vs. writes)
RENDER_EVERY_S = 0.05  # new text reaches the screen at most 20 times a second (the UI's CPU time
# and the GIL are taken from the engine thread; Markdown re-parses the open paragraph per append)


class ReplyView(Protocol):
    """Where a reply is shown while it streams (a `MessageView`; the service knows no widgets)."""

    async def append(self, text: str) -> None: ...

    async def show_reasoning(
        self, text: str, tokens: int, seconds: float | None, done: bool
    ) -> None: ...

    def refresh_meta(self) -> None: ...

    async def finish(self) -> None: ...


def reply_metrics(output: RequestOutput) -> ReplyMetrics:
    metrics = output.metrics
    spec = metrics.speculation
    return ReplyMetrics(
        tokens=len(output.token_ids),
        ttft_s=metrics.time_to_first_token_s,
        tokens_per_s=metrics.decode_tokens_per_s,
        acceptance_rate=spec.acceptance_rate if spec.verifications else None,
        accepted_length=spec.mean_accepted_length if spec.verifications else None,
        prompt_tokens=metrics.prompt_tokens,
        cached_tokens=metrics.cached_tokens,
        disk_cached_tokens=metrics.disk_cached_tokens,
    )


class ReasoningProgress:
    """How long a reply reasoned, in tokens and seconds, counted until its answer starts."""

    def __init__(self) -> None:
        self.tokens = 0
        self.seconds: float | None = None
        self.done = False
        self._shown_at = 0.0

    def update(self, output: RequestOutput, now: float) -> bool:
        """Take in an output; whether the reasoning view should be redrawn now."""
        if output.reasoning is None or self.done:
            return False
        started = output.metrics.first_token_time
        self.done = bool(output.text) or output.finished
        if not self.done:
            self.tokens = len(output.token_ids)
        self.seconds = None if started is None else now - started
        if self.done or now - self._shown_at > RENDER_EVERY_S:
            self._shown_at = now
            return True
        return False

    def shown(self, output: RequestOutput) -> tuple[str, int, float | None, bool]:
        return output.reasoning or "", self.tokens, self.seconds, self.done

    def kept(self, output: RequestOutput) -> Reasoning | None:
        """What the history stores of the reasoning (None: the reply had none)."""
        reasoning = output.reasoning
        return None if reasoning is None else Reasoning(reasoning, self.tokens, self.seconds)


@dataclass(eq=False)
class Reply:
    """Streams one reply into `message` (already stored with status "streaming") and `view`.

    `open_stream` is called inside the worker, so an engine that refuses the prompt fails this
    reply (shown on it), not the screen that started it.
    """

    open_stream: OpenStream
    store: HistoryStore
    message: Message
    view: ReplyView
    stopped_by_user: bool = field(default=False, init=False)
    _interrupted: bool = field(default=False, init=False)

    async def run(self) -> None:
        message = self.message
        saved_at = rendered_at = time.monotonic()
        unrendered: list[str] = []
        thinking = ReasoningProgress()
        try:
            async with aclosing(self.open_stream()) as outputs:
                async for output in outputs:
                    message.content = output.text
                    message.metrics = reply_metrics(output)
                    now = time.monotonic()
                    if thinking.update(output, now):
                        await self.view.show_reasoning(*thinking.shown(output))
                    message.reasoning = thinking.kept(output)
                    if output.finished:
                        self._finish(output)
                        continue  # the stream ends after its final output; finish() shows it all
                    unrendered.append(output.new_text)
                    if now - rendered_at > RENDER_EVERY_S:
                        await self.view.append("".join(unrendered))
                        unrendered.clear()
                        self.view.refresh_meta()
                        rendered_at = now
                    if now - saved_at > SAVE_EVERY_S:
                        self.store.save_message(message)
                        saved_at = now
        except asyncio.CancelledError:
            if self._interrupted:
                raise  # the app is closing; `interrupt` already saved the reply
            message.status = STOPPED if self.stopped_by_user else INTERRUPTED
            self.store.save_message(message)
            if self.stopped_by_user:  # otherwise the view is going away with its session
                await self.view.finish()
            raise
        except PromptTooLongError as error:
            message.status = ERROR
            message.error = f"{error.what}: start a new chat (ctrl+n) or shorten the message"
        except (ValueError, EngineDeadError) as error:
            message.status = ERROR
            message.error = str(error)
        self.store.save_message(message)
        await self.view.finish()

    def _finish(self, output: RequestOutput) -> None:
        reason = output.finish_reason
        if reason == FinishReason.ERROR:
            self.message.status = ERROR
            self.message.error = output.error or "the engine failed this request"
        elif reason == FinishReason.ABORT:
            self.message.status = STOPPED
        else:
            self.message.status = DONE

    def interrupt(self) -> None:
        """Keep what arrived so far, marked interrupted (the app is quitting mid-reply)."""
        self._interrupted = True
        self.message.status = INTERRUPTED
        self.store.save_message(self.message)
