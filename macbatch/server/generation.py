"""One HTTP request's hold on the server, owned by one ``ServedRequest`` from its model's lease
to its one close: the lease, the admission slots and the engine stream, all given back in the
``finally`` of ``served_request`` or, for a stream, of the ``EventStream`` it hands itself to.
A route reads parse -> ``bind`` -> ``generate`` (or ``pool``), so no route frees anything itself
(anchor: vLLM's ``AsyncLLM.generate``, whose ``finally`` aborts the request).

Requests are templated and tokenized up front on a worker thread (so bad input is a 400 before
any byte of a stream is sent, and no other request waits on the work), then queued and streamed
by ``EngineThread.stream_prepared`` (the ``OutputStream`` that ``EngineThread.stream`` reads too),
whose ``close`` cancels what has not finished: the engine frees their KV blocks on its next step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from macbatch.engine import (
    EngineDeadError,
    FinishReason,
    OutputStream,
    PoolingParams,
    PromptInput,
    RequestOutput,
    SamplingParams,
)
from macbatch.models.pool import Loaded, ModelRefused
from macbatch.openai import Bound, Generation
from macbatch.openai.rendering import Event, Renderer
from macbatch.server.errors import APIError, engine_unavailable, invalid, refused
from macbatch.server.serving import ServerState, state_of

# what one HTTP request asks the engine for: a prompt and its sampling or pooling, per request
Jobs = tuple[tuple[PromptInput, SamplingParams | PoolingParams], ...]
OnDone = Callable[[list[RequestOutput]], None]  # sees the finals of a completed generation


@asynccontextmanager
async def served_request(request: Request, requested: Any) -> AsyncIterator[ServedRequest]:
    """The model a request names (its body's ``model``; a non-string is the parser's to
    refuse), loaded if it was not, held until the request's one close: here, unless a stream
    took the request over."""
    state = state_of(request)
    said = requested if isinstance(requested, str) else None
    try:
        model = await state.models.lease(said)
    except ModelRefused as exc:
        raise refused(exc) from None
    adapter = state.models.adapter_of(said)
    # a fine-tune answers by the name the client gave it, the base by its model's
    name = model.model_id if adapter is None or said is None else said
    served = ServedRequest(request, state, model, adapter, name)
    try:
        if not model.thread.alive:
            raise engine_unavailable(_describe(model.thread.error))
        yield served
    finally:
        if not served.streaming:
            served.close()


class ServedRequest:
    """A leased model, the admission slots taken for it and the engine stream, closed once."""

    def __init__(
        self,
        request: Request,
        state: ServerState,
        model: Loaded,
        adapter: str | None = None,
        name: str | None = None,
    ) -> None:
        self.request = request
        self.state = state
        self.model = model
        self.adapter = adapter  # the fine-tune the body's ``model`` named (None: the base)
        self.name = name or model.model_id  # what a response's ``model`` says
        self.streaming = False  # an EventStream owns the close
        self._slots = 0
        self._jobs = 0
        self._finished: set[int] = set()
        self._first_seen: set[int] = set()
        self._stream: OutputStream | None = None
        self._closed = False

    def bind(self, generation: Generation) -> Bound:
        """The engine requests of a parsed body, for this model (400)."""
        bound = generation.bind(self.model.tool_format, self.model.decoder)
        if self.adapter is None:
            return bound
        adapted = tuple((replace(p, adapter=self.adapter), s) for p, s in bound.requests)
        return replace(bound, requests=adapted)

    async def generate(
        self,
        bound: Bound,
        renderer: Renderer,
        stream: bool,
        prompt_param: str = "messages",
        on_done: OnDone | None = None,
    ) -> Response:
        """Admit, submit; then stream the renderer's events or wait for every choice. Every API
        shape comes through here."""
        if any(params.structured is not None for _, params in bound.requests):
            await self.model.thread.prepare_constraints()
        await self._admit(bound.requests, prompt_param)
        if stream:
            self.streaming = True
            return EventStream(self._events(renderer, on_done), on_close=self.close)
        finals = await self._wait()
        body = renderer.response(finals)
        if on_done is not None:
            on_done(finals)
        return JSONResponse(body)

    async def pool(self, jobs: Jobs) -> list[RequestOutput]:
        """Admit, submit and wait for pooling requests (embeddings, scores): the finals in
        order. A body with more inputs than the server admits at once takes the whole of it."""
        await self._admit(jobs, "input", min(len(jobs), self.state.admission.capacity))
        return await self._wait()

    def close(self) -> None:
        """Cancel what has not finished, give the slots and the lease back (idempotent, never
        awaits: it also runs under cancellation)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._stream is not None:
                self._stream.close()
            metrics = self.state.model_metrics[self.model.model_id]
            for _ in range(self._jobs - len(self._finished)):
                metrics.record_abort()
        finally:
            self.state.admission.give_back(self._slots, self.model.model_id)
            self.state.models.give_back(self.model, self.adapter)

    async def _admit(self, jobs: Jobs, prompt_param: str, slots: int | None = None) -> None:
        """Take ``slots`` admission slots (one per job unless given), then template and
        tokenize every job on a worker thread (the input processor is thread-safe: a 4 MB
        prompt takes seconds, and on the event loop it would stall every stream meanwhile)."""
        count = len(jobs) if slots is None else slots
        self.state.admission.take(count, self.model.model_id)
        self._slots = count
        thread = self.model.thread
        try:
            prepared = await asyncio.to_thread(lambda: [thread.prepare(*job) for job in jobs])
            self._stream = thread.stream_prepared(prepared)
        except ValueError as exc:
            chat = jobs[0][0].is_chat
            param = prompt_param if chat or prompt_param == "input" else "prompt"
            raise invalid(str(exc), param) from None
        except EngineDeadError as exc:
            raise engine_unavailable(str(exc)) from None
        self._jobs = len(jobs)

    async def _outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """``(choice index, output)`` until every request finished, counted in the model's
        metrics; APIError if one fails or the engine dies."""
        assert self._stream is not None
        metrics = self.state.model_metrics[self.model.model_id]
        try:
            async for index, out in self._stream:
                # a pooling request's one output is its first (prompt tokens counted; no TTFT)
                first = index not in self._first_seen and bool(
                    out.metrics.first_token_time
                    or out.embedding is not None
                    or out.score is not None
                )
                if first:
                    self._first_seen.add(index)
                metrics.record(out, first)
                if out.finished:
                    self._finished.add(index)
                    if out.finish_reason is FinishReason.ERROR:
                        raise self._error(out)
                yield index, out
        except EngineDeadError:
            raise engine_unavailable(_describe(self.model.thread.error)) from None

    def _error(self, out: RequestOutput) -> APIError:
        """An ERROR finish: 503 if the engine died, 500 if its step failed on this request
        (the engine serves the others on), else this request was unservable (400)."""
        thread = self.model.thread
        if not thread.alive:
            return engine_unavailable(_describe(thread.error))
        if out.step_failed:
            return APIError(
                500, out.error or "the engine failed on this request", code="engine_error"
            )
        return invalid(out.error or "the engine could not run this request")

    async def _wait(self) -> list[RequestOutput]:
        """Every choice's final output, unless the client leaves first (499)."""
        finals = await _unless_disconnected(self.request, self._finals())
        if self.state.shutting_down and any(o.finish_reason is FinishReason.ABORT for o in finals):
            raise APIError(
                503,
                "the server shut down before this request finished; retry when it is back",
                code="server_shutdown",
            )
        return finals

    async def _finals(self) -> list[RequestOutput]:
        finals: dict[int, RequestOutput] = {}
        async for index, out in self._outputs():
            if out.finished:
                finals[index] = out
        return [finals[index] for index in sorted(finals)]

    async def _events(self, renderer: Renderer, on_done: OnDone | None) -> AsyncIterator[str]:
        """SSE lines: the renderer's events as outputs arrive, and its closing events, or its
        error events if generation fails."""
        finals: dict[int, RequestOutput] = {}
        try:
            for event in renderer.open():
                yield _sse(event)
            async for index, out in self._outputs():
                if out.finished:
                    finals[index] = out
                for event in renderer.step(index, out):
                    yield _sse(event)
            done = [finals[index] for index in sorted(finals)]
            for event in renderer.close(done):
                yield _sse(event)
            if on_done is not None:
                on_done(done)
        except APIError as exc:
            for event in renderer.failed(exc):
                yield _sse(event)


def _sse(event: Event) -> str:
    name, data = event
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {name}\n" if name else "") + f"data: {text}\n\n"


class EventStream(StreamingResponse):
    """A server-sent-event response that closes its request however the stream ends: finished,
    failed, client gone (Starlette cancels the body on disconnect) or the server shutting down."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            # uvicorn cancels streams still open at the end of the shutdown timeout; the task
            # ends here either way, and the log gets no traceback for an expected stop.
            pass
        finally:
            self._on_close()


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """Await ``work``, but give up (cancelling it) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise APIError(499, "the client disconnected")
    return task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _describe(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"
