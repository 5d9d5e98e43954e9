"""The Starlette app: OpenAI-compatible routes over an injected EngineThread.

``create_app`` takes a started EngineThread (tests build one on a tiny model; ``macbatch serve``
builds one on the user's model), so the app itself never loads anything.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from macbatch.engine import EngineThread, FinishReason, RequestOutput
from macbatch.engine.tokenizer import Tokenizer
from macbatch.engine.tool_calls import ToolFormat
from macbatch.openai import ChoiceProgress, Endpoint, Formatter, InvalidRequest, parse_body
from macbatch.openai import formatter_for as openai_formatter
from macbatch.openai.bodies import load_json
from macbatch.server.errors import APIError, engine_unavailable, invalid
from macbatch.server.generation import Admission, Run
from macbatch.server.metrics import ServerMetrics

PUBLIC_PATHS = ("/health",)
_log = logging.getLogger("macbatch.server")


@dataclass(frozen=True)
class ServerOptions:
    """Limits and access: ``max_pending`` bounds engine requests running plus waiting."""

    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_pending: int = 320
    model_aliases: tuple[str, ...] = ()


@dataclass
class ServerState:
    thread: EngineThread
    decoder: Tokenizer
    options: ServerOptions
    model_id: str
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    admission: Admission = field(init=False)
    shutting_down: bool = False
    tool_format: ToolFormat | None = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.options.max_pending)
        self.tool_format = self.thread.info.model.tool_format  # decided once, at load

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_id and name not in self.options.model_aliases:
            raise APIError(
                404,
                f"model {name!r} is not served here; this server runs {self.model_id!r} "
                "(see GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def check_engine(self) -> None:
        if not self.thread.alive:
            error = self.thread.error
            raise engine_unavailable(None if error is None else f"{type(error).__name__}: {error}")


def create_app(
    thread: EngineThread,
    decoder: Tokenizer,
    options: ServerOptions | None = None,
    model_id: str | None = None,
) -> Starlette:
    """The ASGI app; ``decoder`` (the model's tokenizer) renders logprob tokens as text."""
    state = ServerState(
        thread=thread,
        decoder=decoder,
        options=options or ServerOptions(),
        model_id=model_id or thread.info.model_name,
    )
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            APIError: _api_error,
            InvalidRequest: _invalid_request,
            HTTPException: _http_error,
        },
    )
    app.state.macbatch = state
    app.add_middleware(_Guard, state=state, known_paths={r.path for r in routes})
    return app


def stop_generating(app: Starlette) -> None:
    """The shutdown deadline: abort everything still generating. Streams end with a final chunk
    (finish_reason "abort") and [DONE]; requests waiting for a whole reply get a 503."""
    state: ServerState = app.state.macbatch
    state.shutting_down = True
    state.thread.abort_all()


def _state(request: Request) -> ServerState:
    return request.app.state.macbatch


async def health(request: Request) -> Response:
    """200 while the engine thread runs, else 503 with its error: for load balancers, launchd."""
    state = _state(request)
    stats = state.thread.stats()
    body: dict[str, Any] = {"status": "ok" if state.thread.alive else "unhealthy"}
    body["model"] = state.model_id
    if not state.thread.alive:
        body["error"] = str(state.thread.error) if state.thread.error else "engine stopped"
    if stats is not None:
        body.update(running=stats.running, waiting=stats.waiting, kv_usage=stats.kv_usage)
    return JSONResponse(body, status_code=200 if state.thread.alive else 503)


async def metrics(request: Request) -> Response:
    state = _state(request)
    text = state.metrics.render(state.thread.stats(), state.thread.alive, state.admission.pending)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_id, "object": "model", "created": 0, "owned_by": "macbatch"}


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(_state(request))]})


async def get_model(request: Request) -> Response:
    state = _state(request)
    state.check_model(request.path_params["model"])
    return JSONResponse(_model_card(state))


async def chat_completions(request: Request) -> Response:
    return await _generate(request, Endpoint.CHAT)


async def completions(request: Request) -> Response:
    return await _generate(request, Endpoint.COMPLETION)


async def _generate(request: Request, endpoint: Endpoint) -> Response:
    """Validate, admit, submit; then stream SSE or wait for every choice."""
    state = _state(request)
    generation = parse_body(endpoint, await _read_json(request, state.options.max_body_bytes))
    state.check_model(generation.model)
    state.check_engine()
    bound = generation.bind(state.tool_format, state.decoder)
    formatter = openai_formatter(generation, bound.parse_with, state.model_id, state.decoder)
    if any(params.structured is not None for _, params in bound.requests):
        await state.thread.prepare_constraints()
    count = len(bound.requests)
    state.admission.take(count)
    try:
        run = Run(state.thread, bound.requests, state.metrics)
        await run.start()
    except BaseException:  # whatever failed, the slots it took go back
        state.admission.give_back(count)
        raise

    def close() -> None:
        run.close()
        state.admission.give_back(count)

    if generation.stream:
        events = _events(run, formatter, count, generation.include_usage)
        return EventStream(events, on_close=close)
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
    return JSONResponse(formatter.response(finals))


async def _finals(run: Run, count: int) -> list[RequestOutput]:
    finals: list[RequestOutput | None] = [None] * count
    async for index, out in run.outputs():
        if out.finished:
            finals[index] = out
    return [out for out in finals if out is not None]


async def _events(
    run: Run, formatter: Formatter, count: int, include_usage: bool
) -> AsyncIterator[str]:
    """SSE lines: chunks as outputs arrive, an error event if generation fails, then [DONE]."""
    progress = [ChoiceProgress() for _ in range(count)]
    finals: list[RequestOutput | None] = [None] * count
    try:
        async for index, out in run.outputs():
            if out.finished:
                finals[index] = out
            for chunk in formatter.chunks(index, out, progress[index]):
                yield _sse(chunk)
        if include_usage:
            yield _sse(formatter.usage_chunk([out for out in finals if out is not None]))
    except APIError as exc:
        yield _sse(exc.body())
    yield "data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


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


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
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


class _Guard:
    """Pure ASGI middleware (it does not buffer streams): API key check on every path but
    /health, and a count of responses by route and status for /metrics."""

    def __init__(self, app: ASGIApp, state: ServerState, known_paths: set[str]) -> None:
        self.app = app
        self.state = state
        self.known_paths = known_paths
        key = state.options.api_key
        self.expected = None if key is None else f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.known_paths or path.startswith("/v1/models/") else "other"

        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.state.metrics.http_responses[(route, message["status"])] += 1
            await send(message)

        if self.expected is not None and path not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer <key>' "
                    "(the key given to macbatch serve --api-key)",
                    code="invalid_api_key",
                )
                await error.response()(scope, receive, counting_send)
                return
        try:
            await self.app(scope, receive, counting_send)
        except Exception as exc:
            # A bug, not the client's fault: answered (and counted) here, because Starlette's
            # own 500 is sent outside every middleware, where no count would see it.
            _log.exception("internal error on %s %s", scope.get("method"), path)
            if not started:
                await _internal_error(exc).response()(scope, receive, counting_send)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InvalidRequest)
    return invalid(str(exc), exc.param).response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; see docs/serve.md"
    else:
        message = f"{request.method} {request.url.path}: {exc.detail}"
    return APIError(exc.status_code, message).response()


def _internal_error(exc: Exception) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")
