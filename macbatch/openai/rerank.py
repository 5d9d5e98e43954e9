"""Rerank and score bodies -> pooling requests, and their scores -> the responses.

``POST /v1/rerank`` takes the shape Cohere, Jina, vLLM and llama.cpp share (``query``,
``documents`` as strings or ``{"text": ...}`` objects, ``top_n``, ``return_documents``; macbatch
adds ``instruction``, the reranker's task line) and needs a cross-encoder (a yes/no reranker).
``POST /v1/score`` takes vLLM's (``text_1``, ``text_2``: a string or a list each; one against
many, or pairwise): a reranker's relevance, or, for any other model, the cosine similarity of
the two texts' embeddings.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from macbatch.engine import EmbeddingProfile, PoolingParams, PromptInput, RequestOutput, Tokenizer
from macbatch.openai.bodies import check_value
from macbatch.openai.embeddings import MAX_INPUTS
from macbatch.openai.errors import InvalidRequest

Job = tuple[PromptInput, PoolingParams]


@dataclass(frozen=True)
class Scoring:
    """Query/document pairs to score, read from a rerank or score body alone."""

    pairs: tuple[tuple[str, str], ...]
    instruction: str | None
    model: str | None

    def bind(self, profile: EmbeddingProfile, tokenizer: Tokenizer) -> tuple[Job, ...]:
        """A reranker: one scoring request per pair. Any other model: one embedding request per
        text, query texts first (``pair_scores`` takes the cosines)."""
        rerank = profile.rerank
        if rerank is None:
            embed = PoolingParams(normalize=True)
            return tuple((PromptInput(text), embed) for text in self._texts())
        params = PoolingParams(score_tokens=rerank.score_tokens)
        return tuple(
            (PromptInput(rerank.prompt_ids(tokenizer, q, d, self.instruction)), params)
            for q, d in self.pairs
        )

    def _texts(self) -> list[str]:
        return [q for q, _ in self.pairs] + [d for _, d in self.pairs]

    def pair_scores(self, outputs: Sequence[RequestOutput]) -> list[float]:
        """Each pair's score from the outputs of ``bind``'s requests, in order."""
        if outputs and outputs[0].score is not None:
            return [float(o.score) for o in outputs if o.score is not None]
        n = len(self.pairs)
        return [float(np.dot(outputs[i].embedding, outputs[n + i].embedding)) for i in range(n)]


@dataclass(frozen=True)
class Rerank:
    scoring: Scoring
    documents: tuple[str, ...]
    top_n: int
    return_documents: bool


def parse_rerank(body: Any) -> Rerank:
    body = _object(body)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise InvalidRequest("'query' must be a non-empty string", "query")
    documents = _documents(body.get("documents"))
    top_n = body.get("top_n", len(documents))
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
        raise InvalidRequest(f"'top_n' must be a positive integer, got {top_n!r}", "top_n")
    return_documents = body.get("return_documents", True)
    if not isinstance(return_documents, bool):
        raise InvalidRequest("'return_documents' must be true or false", "return_documents")
    pairs = tuple((query, d) for d in documents)
    scoring = Scoring(pairs, _string(body, "instruction"), _string(body, "model"))
    return Rerank(scoring, documents, min(top_n, len(documents)), return_documents)


def parse_score(body: Any) -> Scoring:
    body = _object(body)
    first = _texts(body.get("text_1"), "text_1")
    second = _texts(body.get("text_2"), "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise InvalidRequest(
            f"'text_1' holds {len(first)} texts and 'text_2' {len(second)}: give one text_1 "
            "or as many as text_2",
            "text_1",
        )
    return Scoring(tuple(zip(first, second)), _string(body, "instruction"), _string(body, "model"))


def rerank_response(rerank: Rerank, scores: list[float], tokens: int, model: str) -> dict[str, Any]:
    """Results by relevance, highest first, the first ``top_n``."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: rerank.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if rerank.return_documents:
            result["document"] = {"text": rerank.documents[i]}
        results.append(result)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }


def score_response(scores: list[float], tokens: int, model: str) -> dict[str, Any]:
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    check_value(body)
    return body


def _documents(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'documents' must be a non-empty list", "documents")
    texts = []
    for i, item in enumerate(value):
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text:
            raise InvalidRequest(
                f"'documents[{i}]' must be a non-empty string or an object with a non-empty 'text'",
                f"documents[{i}]",
            )
        texts.append(text)
    return _bounded(texts, "documents")


def _texts(value: Any, name: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise InvalidRequest(f"'{name}' must be a string or a non-empty list of strings", name)
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise InvalidRequest(f"'{name}[{i}]' must be a non-empty string", f"{name}[{i}]")
    return _bounded(items, name)


def _bounded(items: list[str], name: str) -> tuple[str, ...]:
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"'{name}' holds {len(items)} texts; at most {MAX_INPUTS}", name)
    return tuple(items)


def _string(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string, got {value!r}", name)
    return value
