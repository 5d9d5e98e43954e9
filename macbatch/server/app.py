"""The Starlette app: OpenAI-compatible routes over a pool of models.

``create_app`` takes one started EngineThread (tests build one on a tiny model);
``create_pool_app`` takes a ``ModelPool`` (``macbatch serve``: its models, loaded up front or on
demand; docs/models.md).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from macbatch.engine import EngineThread, Tokenizer
from macbatch.models.memory import Need
from macbatch.models.pool import ModelPool, ModelRefused, PoolLimits, Servable
from macbatch.openai import Endpoint, InvalidRequest, parse_body
from macbatch.openai import formatter_for as openai_formatter
from macbatch.server import agents, embeddings, ps
from macbatch.server.batchapi import routes as batch_routes
from macbatch.server.batchapi.service import BatchAPI, BatchAPIUnavailable, open_batch_api
from macbatch.server.errors import APIError, invalid, refused, speaks_anthropic, within
from macbatch.server.generation import served_request
from macbatch.server.model_cards import adapter_cards, model_card, render_metrics
from macbatch.server.origins import HostOriginGuard, allowed_host_names, normalized_origins
from macbatch.server.parsing import parse_body_off_loop
from macbatch.server.presets import CHAT, COMPLETION, with_preset
from macbatch.server.serving import ServerOptions, ServerState, read_json, state_of

__all__ = ["ServerOptions", "create_app", "create_pool_app", "stop_batches", "stop_generating"]

PUBLIC_PATHS = ("/health",)
_log = logging.getLogger("macbatch.server")


def create_app(
    thread: EngineThread,
    decoder: Tokenizer,
    options: ServerOptions | None = None,
    model_id: str | None = None,
) -> Starlette:
    """The ASGI app over one started engine thread, which never unloads; ``decoder`` (the
    model's tokenizer) renders logprob tokens as text."""
    options = options or ServerOptions()
    name = model_id or thread.info.model_name
    adapters = tuple((a, ref.path) for a, ref in thread.info.model.adapters.items())
    entry = Servable(name, name, None, options.model_aliases, adapters)
    pool = ModelPool([entry], None, options.images, PoolLimits(keep_alive_s=None))
    pool.add_loaded(pool.loaded_model(thread, name, Need(0, 0), decoder))
    return create_pool_app(pool, options)


def create_pool_app(models: ModelPool, options: ServerOptions) -> Starlette:
    """The ASGI app over a pool of models (``macbatch serve``); the first model's is loaded."""
    state = ServerState(models, options)
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        *agents.ROUTES,
        *batch_routes.ROUTES,
        *embeddings.ROUTES,
        *ps.ROUTES,
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            APIError: _api_error,
            InvalidRequest: _invalid_request,
            HTTPException: _http_error,
        },
    )
    if state.options.data_dir is not None:
        try:
            state.batch_api = _batch_api(state)
            state.first.pinned = True  # the batch thread holds its engine
        except BatchAPIUnavailable as exc:
            _log.warning("%s", exc)
            state.batch_api_off = str(exc)
    app.state.macbatch = state
    _add_guards(app, state, {r.path for r in routes})
    return app


def _add_guards(app: Starlette, state: ServerState, known_paths: set[str]) -> None:
    """Outermost first: CORS headers for the allowed origins (their browsers' preflights are
    answered there), the API key and the count of responses, then Host and Origin."""
    options = state.options
    hosts = allowed_host_names(options.bound_host, options.allowed_hosts)
    origins = normalized_origins(options.allowed_origins)
    app.add_middleware(HostOriginGuard, hosts=hosts, origins=origins)
    app.add_middleware(_Guard, state=state, known_paths=known_paths)
    if origins is None or origins:
        allowed = ["*"] if origins is None else sorted(origins)
        app.add_middleware(
            CORSMiddleware, allow_origins=allowed, allow_methods=["*"], allow_headers=["*"]
        )


def _batch_api(state: ServerState) -> BatchAPI:
    """The Batch API over the data directory, on the first model. Live requests first: a batch
    keeps at most ``batch_max_in_flight`` requests in the engine (half its sequences by
    default), and none that would leave a live request without a sequence to run in."""
    options, first = state.options, state.first
    assert options.data_dir is not None
    seqs = first.thread.call(lambda engine: engine.config.max_num_seqs).result(timeout=60)
    most = options.batch_max_in_flight or max(1, seqs // 2)

    def room() -> int:
        return max(0, min(most, seqs - state.admission.pending_of(first.model_id)))

    return open_batch_api(
        options.data_dir,
        first.thread,
        first.model_id,
        first.decoder,
        room,
        options.max_file_bytes,
        first.images,
    )


def stop_generating(app: Starlette) -> None:
    """The shutdown deadline: abort everything still generating. Streams end with a final chunk
    (finish_reason "abort") and [DONE]; requests waiting for a whole reply get a 503."""
    state: ServerState = app.state.macbatch
    state.shutting_down = True
    stop_batches(app, wait_s=0)  # on the event loop: say stop, do not wait
    for loaded in state.models.loaded.values():
        loaded.thread.abort_all()


def stop_batches(app: Starlette, wait_s: float = 30) -> None:
    """Stop the batch thread (its requests in flight are aborted) and wait up to ``wait_s``
    for it; unfinished batches stay in the data directory and resume when a server starts on
    it again."""
    api: BatchAPI | None = app.state.macbatch.batch_api
    if api is not None:
        api.close(wait_s)


async def health(request: Request) -> Response:
    """200 while every loaded model's engine thread runs, else 503 with the errors: for load
    balancers, launchd. The first model's engine counts are at the top, as with one model."""
    state = state_of(request)
    loaded = state.models.loaded
    down = {name: m.thread.error for name, m in loaded.items() if not m.thread.alive}
    body: dict[str, Any] = {"status": "unhealthy" if down else "ok"}
    body["model"] = state.models.default
    if down:
        body["error"] = "; ".join(
            f"{name}: {error if error else 'engine stopped'}" for name, error in down.items()
        )
    first = loaded.get(state.models.default)
    stats = None if first is None else first.thread.stats()
    if stats is not None:
        body.update(running=stats.running, waiting=stats.waiting, kv_usage=stats.kv_usage)
    body["loaded_models"] = sorted(loaded)
    return JSONResponse(body, status_code=503 if down else 200)


async def metrics(request: Request) -> Response:
    state = state_of(request)
    text = render_metrics(state.metrics, state.model_metrics, state.models, state.admission)
    if state.batch_api is not None:
        text += "\n".join(state.batch_api.metrics()) + "\n"
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def list_models(request: Request) -> Response:
    models = state_of(request).models
    cards = [
        card for n in models.catalog for card in (model_card(models, n), *adapter_cards(models, n))
    ]
    return JSONResponse({"object": "list", "data": cards})


async def get_model(request: Request) -> Response:
    models = state_of(request).models
    try:
        name = models.name_of(request.path_params["model"])
    except ModelRefused as exc:
        raise refused(exc) from None
    # a model not loaded has its card read from its files: off the event loop, which streams
    return JSONResponse(await asyncio.to_thread(model_card, models, name))


async def chat_completions(request: Request) -> Response:
    return await _generate(request, Endpoint.CHAT)


async def completions(request: Request) -> Response:
    return await _generate(request, Endpoint.COMPLETION)


async def _generate(request: Request, endpoint: Endpoint) -> Response:
    """Chat and legacy completions: parse, then serve with the OpenAI chunk renderer."""
    state = state_of(request)
    body = await read_json(request, state.options.max_body_bytes)
    body = with_preset(body, CHAT if endpoint is Endpoint.CHAT else COMPLETION)
    async with served_request(request, body.get("model")) as served:
        keep, images = state.options.keep_volatile_prompt_lines, served.model.images
        generation = await parse_body_off_loop(
            body, lambda: parse_body(endpoint, body, keep_volatile=keep, images=images)
        )
        bound = served.bind(generation)
        model = served.model
        formatter = openai_formatter(generation, bound.parse_with, served.name, model.decoder)
        return await served.generate(bound, formatter, generation.stream)


class _Guard:
    """Pure ASGI middleware (it does not buffer streams): API key check on every path but
    /health, and a count of responses by route and status for /metrics."""

    def __init__(self, app: ASGIApp, state: ServerState, known_paths: set[str]) -> None:
        self.app = app
        self.state = state
        self.known_paths = known_paths
        key = state.options.api_key
        self.expected = None if key is None else f"Bearer {key}".encode()
        self.key = None if key is None else key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.known_paths else "other"
        for prefix in ("/v1/models/", "/v1/responses/", "/v1/files/", "/v1/batches/"):
            route = prefix + "{id}" if path.startswith(prefix) else route
        anthropic = speaks_anthropic(path)

        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.state.metrics.http_responses[(route, message["status"])] += 1
            await send(message)

        if self.expected is not None and path not in PUBLIC_PATHS and not self._allowed(scope):
            error = APIError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: "
                "<key>' (the key given to macbatch serve --api-key)",
                code="invalid_api_key",
            )
            await error.response(anthropic)(scope, receive, counting_send)
            return
        try:
            await self.app(scope, receive, counting_send)
        except Exception as exc:
            # A bug, not the client's fault: answered (and counted) here, because Starlette's
            # own 500 is sent outside every middleware, where no count would see it.
            _log.exception("internal error on %s %s", scope.get("method"), path)
            if not started:
                error = _internal_error(exc, self.state.options.data_dir)
                await error.response(anthropic)(scope, receive, counting_send)

    def _allowed(self, scope: Scope) -> bool:
        """``Authorization: Bearer KEY`` (OpenAI's clients) or ``x-api-key: KEY`` (Anthropic's);
        both compared in constant time."""
        assert self.expected is not None and self.key is not None
        headers = dict(scope["headers"])
        bearer = hmac.compare_digest(headers.get(b"authorization", b""), self.expected)
        return hmac.compare_digest(headers.get(b"x-api-key", b""), self.key) or bearer


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response(speaks_anthropic(request.url.path))


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InvalidRequest)
    return invalid(str(exc), exc.param).response(speaks_anthropic(request.url.path))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; see docs/serve.md"
    else:
        message = f"{request.method} {request.url.path}: {exc.detail}"
    return APIError(exc.status_code, message).response(speaks_anthropic(request.url.path))


def _internal_error(exc: Exception, data_dir: Path | None) -> APIError:
    return APIError(500, within(f"internal error: {type(exc).__name__}: {exc}", data_dir))
