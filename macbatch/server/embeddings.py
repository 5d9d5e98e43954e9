"""The routes that pool instead of generating: ``/v1/embeddings`` (OpenAI), ``/v1/rerank``
(Cohere / Jina / vLLM / llama.cpp) and ``/v1/score`` (vLLM). Bodies are parsed in
``macbatch.openai.embeddings`` / ``rerank``; the engine requests are pooling requests
(docs/embeddings.md), admitted and waited for by ``serving.serve_pooling``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from macbatch.engine import RequestOutput
from macbatch.openai import rerank as scoring
from macbatch.openai.embeddings import embeddings_response, parse_embeddings
from macbatch.server.errors import invalid
from macbatch.server.serving import ServerState, read_json, serve_pooling, state_of


async def embeddings(request: Request) -> Response:
    state = state_of(request)
    parsed = parse_embeddings(await read_json(request, state.options.max_body_bytes))
    _check(state, parsed.model)
    outputs = await serve_pooling(request, state, parsed.bind(state.thread.info.model.embedding))
    return JSONResponse(embeddings_response(outputs, state.model_id, parsed.encoding_format))


async def rerank(request: Request) -> Response:
    state = state_of(request)
    parsed = scoring.parse_rerank(await read_json(request, state.options.max_body_bytes))
    _check(state, parsed.scoring.model)
    if state.thread.info.model.embedding.rerank is None:
        raise invalid(
            f"model {state.model_id!r} is not a reranker (a yes/no cross-encoder such as "
            "Qwen3-Reranker, recognised by 'rerank' in its name or by serve --reranker); it "
            "can embed (/v1/embeddings) and score by cosine similarity (/v1/score)",
            "model",
        )
    scores, tokens = await _scores(request, state, parsed.scoring)
    return JSONResponse(scoring.rerank_response(parsed, scores, tokens, state.model_id))


async def score(request: Request) -> Response:
    state = state_of(request)
    parsed = scoring.parse_score(await read_json(request, state.options.max_body_bytes))
    _check(state, parsed.model)
    scores, tokens = await _scores(request, state, parsed)
    return JSONResponse(scoring.score_response(scores, tokens, state.model_id))


async def _scores(
    request: Request, state: ServerState, pairs: scoring.Scoring
) -> tuple[list[float], int]:
    jobs = pairs.bind(state.thread.info.model.embedding, state.decoder)
    outputs = await serve_pooling(request, state, jobs)
    return pairs.pair_scores(outputs), _tokens(outputs)


def _tokens(outputs: list[RequestOutput]) -> int:
    return sum(o.metrics.prompt_tokens for o in outputs)


def _check(state: ServerState, model: str | None) -> None:
    state.check_model(model)
    state.check_engine()


def model_capabilities(state: ServerState) -> dict[str, Any]:
    """What ``/v1/models`` says the model does besides generating: it embeds (every model: its
    pooling and dimensions), and scores pairs as a reranker when it is one."""
    profile = state.thread.info.model.embedding
    tasks = ["generate", "embed", "score"] + (["rerank"] if profile.rerank else [])
    return {
        "tasks": tasks,
        "embedding": {
            "pooling": profile.pooling,
            "dimensions": profile.hidden_size,
            "normalize": profile.normalize,
            "embedding_model": profile.embedding_model,
            "prompts": sorted(profile.prompts),
        },
    }


ROUTES = [
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/rerank", rerank, methods=["POST"]),
    Route("/v1/score", score, methods=["POST"]),
]
