"""Job rows that pool instead of generating: ``task: embed`` and ``task: rerank`` rows, and
OpenAI-batch rows with ``url: /v1/embeddings`` or ``/v1/score``.

A row becomes the body serve would take on that route, read by the same parser
(``macbatch.openai.embeddings`` / ``rerank``), so a row means what the body means to serve; its
result line holds the response serve would send. A row may need several engine requests (a list
of inputs, or a query scored against several texts): ``pending.Pending`` gathers their outputs
and the line is written when the last one arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from macbatch.engine import (
    EmbeddingProfile,
    PoolingParams,
    PromptInput,
    RequestOutput,
    Tokenizer,
)
from macbatch.openai.embeddings import Embedding, embeddings_response, parse_embeddings
from macbatch.openai.rerank import Scoring, parse_score, score_response

EMBEDDINGS_URL = "/v1/embeddings"
SCORE_URL = "/v1/score"
POOLED_URLS = (EMBEDDINGS_URL, SCORE_URL)
TASKS = ("generate", "embed", "rerank")


@dataclass(frozen=True)
class PooledRow:
    """One row's embedding (``embedding``) or scoring (``scoring``) work."""

    embedding: Embedding | None = None
    scoring: Scoring | None = None

    def bind(
        self, profile: EmbeddingProfile, tokenizer: Tokenizer
    ) -> tuple[tuple[PromptInput, PoolingParams], ...]:
        if self.embedding is not None:
            return self.embedding.bind(profile)
        assert self.scoring is not None
        return self.scoring.bind(profile, tokenizer)

    def response(self, outputs: Sequence[RequestOutput], model: str) -> dict[str, Any]:
        if self.embedding is not None:
            return embeddings_response(outputs, model, self.embedding.encoding_format)
        assert self.scoring is not None
        tokens = sum(o.metrics.prompt_tokens for o in outputs)
        return score_response(self.scoring.pair_scores(outputs), tokens, model)


def embedding_row(text: Any, settings: dict[str, Any] | None) -> PooledRow:
    """A ``task: embed`` row's text (or token ids) with the job's ``embedding:`` settings."""
    return PooledRow(embedding=parse_embeddings({**(settings or {}), "input": text}))


def rerank_row(query: Any, document: Any, instruction: str | None) -> PooledRow:
    """A ``task: rerank`` row: its query scored against its document."""
    body = {"text_1": query, "text_2": document, "instruction": instruction}
    return PooledRow(scoring=parse_score(body))


def body_row(url: str, body: dict[str, Any]) -> PooledRow:
    """An OpenAI-batch row for one of ``POOLED_URLS``."""
    if url == EMBEDDINGS_URL:
        return PooledRow(embedding=parse_embeddings(body))
    return PooledRow(scoring=parse_score(body))
