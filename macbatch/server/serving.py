"""What every generating route shares: the server's state, reading a body, binding it to the
model, and serving it (admission, ``Run``, a whole answer or an ``EventStream``) through the
``Renderer`` of the route's API shape (chat completions, Responses, Anthropic Messages)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from macbatch.engine import (
    EngineThread,
    FinishReason,
    PoolingParams,
    PromptInput,
    RequestOutput,
)
from macbatch.models.pool import Loaded, ModelPool, ModelRefused
from macbatch.openai import DATA_ONLY, Bound, Generation, ImageAccess
from macbatch.openai.bodies import load_json
from macbatch.openai.rendering import Event, Renderer
from macbatch.server.errors import APIError, engine_unavailable, invalid, refused
from macbatch.server.generation import Admission, Jobs, Run
from macbatch.server.metrics import ServerMetrics
from macbatch.server.stored import ResponseStore

if TYPE_CHECKING:
    from macbatch.server.batchapi.service import BatchAPI

LEASES = "macbatch.models.local"  # the request scope's key: the models a request holds


@dataclass(frozen=True)
class ServerOptions:
    """Limits and access: ``max_pending`` bounds engine requests running plus waiting."""

    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_pending: int = 320
    model_aliases: tuple[str, ...] = ()
    # Stored responses, batch files and batches live here (macbatch serve: the data directory);
    # None: responses in memory and no Batch API.
    data_dir: Path | None = None
    max_file_bytes: int = 200 * 1024 * 1024  # one /v1/files upload (OpenAI's batch file limit)
    batch_max_in_flight: int | None = None  # a batch's requests in the engine; None: half the seqs
    # leave agent clients' volatile prompt lines in (macbatch.openai.volatile; docs/serve.md)
    keep_volatile_prompt_lines: bool = False
    # where image parts may come from (macbatch serve: --allow-remote-images, ...; serve.md)
    images: ImageAccess = DATA_ONLY
    # the names a request's Host may give and the web pages that may call it (server/origins.py)
    bound_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()


@dataclass
class ServerState:
    models: ModelPool
    options: ServerOptions
    metrics: ServerMetrics = field(default_factory=ServerMetrics)  # HTTP responses by route
    model_metrics: dict[str, ServerMetrics] = field(init=False)  # each model's, by name
    responses: ResponseStore = field(init=False)  # /v1/responses, stored
    admission: Admission = field(init=False)
    shutting_down: bool = False
    batch_api: BatchAPI | None = field(init=False, default=None)
    batch_api_off: str = (  # why batch_api is None, answered on its routes
        "the Batch API needs a data directory (macbatch serve has one; see docs/serve.md)"
    )

    def __post_init__(self) -> None:
        self.model_metrics = {name: ServerMetrics() for name in self.models.catalog}
        if len(self.models.catalog) == 1:  # one model: its counters are the server's, unlabelled
            self.model_metrics[self.models.default] = self.metrics
        self.admission = Admission(self.options.max_pending)
        self.responses = ResponseStore(self.options.data_dir)

    @property
    def first(self) -> Loaded:
        """The first model given (the Batch API's, pinned while the Batch API runs)."""
        return self.models.loaded[self.models.default]

    @property
    def thread(self) -> EngineThread:
        return self.first.thread


def check_engine(loaded: Loaded) -> None:
    if not loaded.thread.alive:
        error = loaded.thread.error
        raise engine_unavailable(None if error is None else f"{type(error).__name__}: {error}")


async def model_for(request: Request, requested: Any) -> Loaded:
    """The model a request names (its body's ``model``; a non-string is the parser's to
    refuse), loaded if it was not, and held until the response ends (the app's guard gives it
    back then, streams included)."""
    state = state_of(request)
    try:
        loaded = await state.models.lease(requested if isinstance(requested, str) else None)
    except ModelRefused as exc:
        raise refused(exc) from None
    request.scope.setdefault(LEASES, []).append(loaded)
    check_engine(loaded)
    return loaded


def give_back_models(scope: Scope, models: ModelPool) -> None:
    """The end of a response: its models may unload again."""
    for loaded in scope.pop(LEASES, []):
        models.give_back(loaded)


def route_table(*rows: tuple[str, str, Callable[[Request], Awaitable[Response]]]) -> list[Route]:
    """Routes from (method, path, handler) rows."""
    return [Route(path, handler, methods=[method]) for method, path, handler in rows]


def state_of(request: Request) -> ServerState:
    return request.app.state.macbatch


def bind(loaded: Loaded, generation: Generation) -> Bound:
    """The engine requests of a parsed body, for its model (400 / 503)."""
    check_engine(loaded)
    return generation.bind(loaded.tool_format, loaded.decoder)


async def serve_generation(
    request: Request,
    state: ServerState,
    loaded: Loaded,
    bound: Bound,
    renderer: Renderer,
    stream: bool,
    prompt_param: str = "messages",
    on_done: Callable[[list[RequestOutput]], None] | None = None,
) -> Response:
    """Admit, submit; then stream the renderer's events or wait for every choice. Every API
    shape comes through here; ``on_done`` sees the finals of a generation that completed."""
    if any(params.structured is not None for _, params in bound.requests):
        await loaded.thread.prepare_constraints()
    count = len(bound.requests)
    run, close = await _admit(state, loaded, bound.requests, prompt_param)
    if stream:
        return EventStream(_events(run, renderer, count, on_done), on_close=close)
    finals = await _wait(request, state, run, count, close)
    body = renderer.response(finals)
    if on_done is not None:
        on_done(finals)
    return JSONResponse(body)


async def serve_pooling(
    request: Request,
    state: ServerState,
    loaded: Loaded,
    jobs: tuple[tuple[PromptInput, PoolingParams], ...],
) -> list[RequestOutput]:
    """Admit, submit and wait for pooling requests (embeddings, scores): the finals in order. A
    body with more inputs than the server admits at once takes the whole of it."""
    slots = min(len(jobs), state.admission.capacity)
    run, close = await _admit(state, loaded, jobs, "input", slots)
    return await _wait(request, state, run, len(jobs), close)


async def _admit(
    state: ServerState, loaded: Loaded, jobs: Jobs, prompt_param: str, slots: int | None = None
) -> tuple[Run, Callable[[], None]]:
    """Take ``slots`` admission slots (one per job unless given) and start the run; returns it
    and the function that cancels what is left and gives the slots back."""
    count = len(jobs) if slots is None else slots
    state.admission.take(count)
    loaded.pending += count
    try:
        run = Run(loaded.thread, jobs, state.model_metrics[loaded.model_id], prompt_param)
        await run.start()
    except BaseException:  # whatever failed, the slots it took go back
        state.admission.give_back(count)
        loaded.pending -= count
        raise

    def close() -> None:
        run.close()
        state.admission.give_back(count)
        loaded.pending -= count

    return run, close


async def _wait(
    request: Request, state: ServerState, run: Run, count: int, close: Callable[[], None]
) -> list[RequestOutput]:
    try:
        finals = await _unless_disconnected(request, _finals(run, count))
    finally:
        close()
    if state.shutting_down and any(out.finish_reason is FinishReason.ABORT for out in finals):
        raise APIError(
            503,
            "the server shut down before this request finished; retry when it is back",
            code="server_shutdown",
        )
    return finals


async def _finals(run: Run, count: int) -> list[RequestOutput]:
    finals: list[RequestOutput | None] = [None] * count
    async for index, out in run.outputs():
        if out.finished:
            finals[index] = out
    return [out for out in finals if out is not None]


async def _events(
    run: Run,
    renderer: Renderer,
    count: int,
    on_done: Callable[[list[RequestOutput]], None] | None,
) -> AsyncIterator[str]:
    """SSE lines: the renderer's events as outputs arrive, and its closing events, or its error
    events if generation fails."""
    finals: list[RequestOutput | None] = [None] * count
    try:
        for event in renderer.open():
            yield _sse(event)
        async for index, out in run.outputs():
            if out.finished:
                finals[index] = out
            for event in renderer.step(index, out):
                yield _sse(event)
        done = [out for out in finals if out is not None]
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
    """A server-sent-event response whose cleanup runs however the stream ends: finished,
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


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The JSON object body, refusing bodies over ``limit`` bytes before reading them whole."""
    too_large = APIError(
        413,
        f"request body over {limit} bytes; send a shorter prompt or raise serve --max-body-mb",
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    data = load_json(bytes(body))
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    return data
