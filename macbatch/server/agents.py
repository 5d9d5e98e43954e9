"""The routes coding agents speak: OpenAI's Responses API (Codex CLI) and Anthropic's Messages API
(Claude Code). Each parses its body into the same engine requests as chat
(``macbatch.openai.responses_api`` / ``anthropic_api``) and is served the same way
(``generation.ServedRequest.generate``) through its own renderer."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from macbatch.openai.anthropic_api import parse_messages
from macbatch.openai.anthropic_output import MessagesRenderer
from macbatch.openai.bodies import check_value
from macbatch.openai.responses_api import parse_responses, previous_response_id
from macbatch.openai.responses_output import ResponsesRenderer
from macbatch.server.errors import APIError, invalid
from macbatch.server.generation import served_request
from macbatch.server.parsing import parse_body_off_loop
from macbatch.server.presets import MESSAGES, RESPONSES, with_preset
from macbatch.server.serving import ServerState, read_json, route_table, state_of
from macbatch.server.stored import MAX_STORED, Stored


async def create_response(request: Request) -> Response:
    state = state_of(request)
    body = await read_json(request, state.options.max_body_bytes)
    body = with_preset(body, RESPONSES)
    check_value(body)  # echoed and stored whole (metadata too): every field, not just the chat's
    previous = previous_response_id(body)
    history = None if previous is None else _stored(state, previous).conversation
    lines = state.options.keep_volatile_prompt_lines
    async with served_request(request, body.get("model")) as served:
        images = served.model.images
        parsed = await parse_body_off_loop(
            body, lambda: parse_responses(body, history, lines, images)
        )
        bound = served.bind(parsed.generation)
        renderer = ResponsesRenderer(parsed, bound.parse_with, served.name)

        def keep(finals: list) -> None:
            if parsed.store:
                state.responses.put(renderer.response(finals), renderer.conversation(finals))

        return await served.generate(bound, renderer, parsed.generation.stream, "input", keep)


async def get_response(request: Request) -> Response:
    state = state_of(request)
    return JSONResponse(_stored(state, request.path_params["response_id"]).response)


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    if not state_of(request).responses.delete(response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


def _stored(state: ServerState, response_id: str) -> Stored:
    stored = state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _not_found(response_id: str) -> APIError:
    return APIError(
        404,
        f"no stored response {response_id!r} (the server keeps the last {MAX_STORED:,} "
        "created with store: true, in its data directory, until deleted)",
        param="previous_response_id",
        code="response_not_found",
    )


async def create_message(request: Request) -> Response:
    state = state_of(request)
    body = await read_json(request, state.options.max_body_bytes)
    body = with_preset(body, MESSAGES)
    lines = state.options.keep_volatile_prompt_lines
    async with served_request(request, body.get("model")) as served:
        model = served.model
        images = model.images
        parsed = await parse_body_off_loop(body, lambda: parse_messages(body, False, lines, images))
        bound = served.bind(parsed.generation)
        renderer = MessagesRenderer(parsed, bound.parse_with, served.name, model.decoder)
        return await served.generate(bound, renderer, parsed.generation.stream)


async def count_tokens(request: Request) -> Response:
    """The prompt's tokens, templated as /v1/messages would (tools and thinking included)."""
    state = state_of(request)
    body = await read_json(request, state.options.max_body_bytes)
    body = with_preset(body, MESSAGES)
    lines = state.options.keep_volatile_prompt_lines
    async with served_request(request, body.get("model")) as served:
        images = served.model.images
        parsed = await parse_body_off_loop(body, lambda: parse_messages(body, True, lines, images))
        [(prompt, _)] = served.bind(parsed.generation).requests
        try:
            ids = await asyncio.to_thread(served.model.thread.encode_prompt, prompt)
        except ValueError as exc:
            raise invalid(str(exc), "messages") from None
    return JSONResponse({"input_tokens": len(ids)})


ROUTES = route_table(
    ("POST", "/v1/responses", create_response),
    ("GET", "/v1/responses/{response_id}", get_response),
    ("DELETE", "/v1/responses/{response_id}", delete_response),
    ("POST", "/v1/messages", create_message),
    ("POST", "/v1/messages/count_tokens", count_tokens),
)
