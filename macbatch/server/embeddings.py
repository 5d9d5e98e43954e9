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
from macbatch.models.pool import Loaded
from macbatch.openai import rerank as scoring
from macbatch.openai.embeddings import embeddings_response, parse_embeddings
from macbatch.server.errors import invalid
from macbatch.server.serving import ServerState, model_for, read_json, serve_pooling, state_of


async def embeddings(request: Request) -> Response:
    state = state_of(request)
    parsed = parse_embeddings(await read_json(request, state.options.max_body_bytes))
    model = await model_for(request, parsed.model)
    jobs = parsed.bind(model.thread.info.model.embedding)
    outputs = await serve_pooling(request, state, model, jobs)
    return JSONResponse(embeddings_response(outputs, model.model_id, parsed.encoding_format))


async def rerank(request: Request) -> Response:
    state = state_of(request)
    parsed = scoring.parse_rerank(await read_json(request, state.options.max_body_bytes))
    model = await model_for(request, parsed.scoring.model)
    if model.thread.info.model.embedding.rerank is None:
        raise invalid(
            f"model {model.model_id!r} is not a reranker (a yes/no cross-encoder such as "
            "Qwen3-Reranker, recognised by 'rerank' in its name or by serve --reranker); it "
            "can embed (/v1/embeddings) and score by cosine similarity (/v1/score)",
            "model",
        )
    scores, tokens = await _scores(request, state, model, parsed.scoring)
    return JSONResponse(scoring.rerank_response(parsed, scores, tokens, model.model_id))


async def score(request: Request) -> Response:
    state = state_of(request)
    parsed = scoring.parse_score(await read_json(request, state.options.max_body_bytes))
    model = await model_for(request, parsed.model)
    scores, tokens = await _scores(request, state, model, parsed)
    return JSONResponse(scoring.score_response(scores, tokens, model.model_id))


async def _scores(
    request: Request, state: ServerState, model: Loaded, pairs: scoring.Scoring
) -> tuple[list[float], int]:
    jobs = pairs.bind(model.thread.info.model.embedding, model.decoder)
    outputs = await serve_pooling(request, state, model, jobs)
    return pairs.pair_scores(outputs), _tokens(outputs)


def _tokens(outputs: list[RequestOutput]) -> int:
    return sum(o.metrics.prompt_tokens for o in outputs)


def model_capabilities(model: Loaded) -> dict[str, Any]:
    """What ``/v1/models`` says the model does besides generating: it embeds (every model: its
    pooling and dimensions), and scores pairs as a reranker when it is one."""
    profile = model.thread.info.model.embedding
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
