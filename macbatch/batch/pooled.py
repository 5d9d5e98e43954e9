"""Job rows that pool instead of generating: ``task: embed`` and ``task: rerank`` rows, and
OpenAI-batch rows with ``url: /v1/embeddings`` or ``/v1/score``.

A row becomes the body serve would take on that route, read by the same parser
(``macbatch.openai.embeddings`` / ``rerank``), so a row means what the body means to serve; its
result line holds the response serve would send. A row may need several engine requests (a list
of inputs, or a query scored against several texts): ``Pending`` gathers their outputs and the
line is written when the last one arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from macbatch.engine import EmbeddingProfile, PoolingParams, PromptInput, RequestOutput
from macbatch.engine.tokenizer import Tokenizer
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


@dataclass
class Pending:
    """The engine requests of the pooled rows in flight: which row each belongs to, and the
    outputs gathered so far."""

    _rows: dict[str, tuple[Any, list[RequestOutput | None]]] = field(default_factory=dict)
    _request_rows: dict[str, tuple[str, int]] = field(default_factory=dict)

    def add(self, key: str, item: Any, request_ids: list[str]) -> None:
        self._rows[key] = (item, [None] * len(request_ids))
        for index, request_id in enumerate(request_ids):
            self._request_rows[request_id] = (key, index)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._request_rows

    def finish(self, output: RequestOutput) -> tuple[Any, list[RequestOutput]] | None:
        """Record a final output; the row and all its outputs once it is the last (None: more
        to come, or its row failed already)."""
        key, index = self._request_rows.pop(output.request_id)
        row = self._rows.get(key)
        if row is None:
            return None
        item, outputs = row
        outputs[index] = output
        if any(o is None for o in outputs):
            return None
        del self._rows[key]
        return item, [o for o in outputs if o is not None]

    def fail(self, request_id: str) -> list[str] | None:
        """A request of a row failed or was aborted: forget the row, and return its other
        requests still running (to abort; their outputs then finish nothing). None: the row
        had failed already."""
        key, _ = self._request_rows.pop(request_id)
        if self._rows.pop(key, None) is None:
            return None
        return [r for r, (k, _) in self._request_rows.items() if k == key]
