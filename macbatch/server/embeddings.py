"""The routes that pool instead of generating: ``/v1/embeddings`` (OpenAI), ``/v1/rerank``
(Cohere / Jina / vLLM / llama.cpp) and ``/v1/score`` (vLLM). Bodies are parsed in
``macbatch.openai.embeddings`` / ``rerank``; the engine requests are pooling requests
(docs/embeddings.md), admitted and waited for by ``generation.ServedRequest.pool``."""

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
from macbatch.server.generation import ServedRequest, served_request
from macbatch.server.serving import read_json, state_of


async def embeddings(request: Request) -> Response:
    state = state_of(request)
    parsed = parse_embeddings(await read_json(request, state.options.max_body_bytes))
    async with served_request(request, parsed.model) as served:
        outputs = await served.pool(parsed.bind(served.model.thread.info.model.embedding))
    return JSONResponse(embeddings_response(outputs, served.model.model_id, parsed.encoding_format))


async def rerank(request: Request) -> Response:
    state = state_of(request)
    parsed = scoring.parse_rerank(await read_json(request, state.options.max_body_bytes))
    async with served_request(request, parsed.scoring.model) as served:
        model_id = served.model.model_id
        if served.model.thread.info.model.embedding.rerank is None:
            raise invalid(
                f"model {model_id!r} is not a reranker (a yes/no cross-encoder such as "
                "Qwen3-Reranker, recognised by 'rerank' in its name or by serve --reranker, or "
                "an encoder's *ForSequenceClassification checkpoint such as bge-reranker); it "
                "can embed (/v1/embeddings) and score by cosine similarity (/v1/score)",
                "model",
            )
        scores, tokens = await _scores(served, parsed.scoring)
    return JSONResponse(scoring.rerank_response(parsed, scores, tokens, model_id))


async def score(request: Request) -> Response:
    state = state_of(request)
    parsed = scoring.parse_score(await read_json(request, state.options.max_body_bytes))
    async with served_request(request, parsed.model) as served:
        scores, tokens = await _scores(served, parsed)
    return JSONResponse(scoring.score_response(scores, tokens, served.model.model_id))


async def _scores(served: ServedRequest, pairs: scoring.Scoring) -> tuple[list[float], int]:
    model = served.model
    outputs = await served.pool(pairs.bind(model.thread.info.model.embedding, model.decoder))
    return pairs.pair_scores(outputs), _tokens(outputs)


def _tokens(outputs: list[RequestOutput]) -> int:
    return sum(o.metrics.prompt_tokens for o in outputs)


def model_capabilities(model: Loaded) -> dict[str, Any]:
    """What ``/v1/models`` says the model does: a decoder generates, embeds (its pooling and
    dimensions) and scores pairs, as a reranker when it is one; an encoder its own tasks."""
    info = model.thread.info.model
    profile = info.embedding
    tasks = list(
        info.tasks or ["generate", "embed", "score"] + (["rerank"] if profile.rerank else [])
    )
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
