"""Job rows that pool instead of generating: ``task: embed`` and ``task: rerank`` rows, and
OpenAI-batch rows with ``url: /v1/embeddings`` or ``/v1/score``.

A row becomes the body serve would take on that route, read by the same parser
(``macbatch.openai.embeddings`` / ``rerank``), so a row means what the body means to serve; its
result line holds the response serve would send. A row may need several engine requests (a list
of inputs, or a query scored against several texts): ``Pending`` gathers their outputs and the
line is written when the last one arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from macbatch.engine import (
    EmbeddingProfile,
    FinishReason,
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


Submit = Callable[[PromptInput, PoolingParams], str]  # queue one request, returning its id
Abort = Callable[[str], None]


@dataclass(frozen=True)
class Settled:
    """A pooled row whose requests are all over: its outputs in order, or why it failed."""

    item: Any
    outputs: list[RequestOutput]
    error: str | None = None

    def body(self, model: str) -> dict[str, Any]:
        """The row's line body: the response serve would send for it."""
        row: PooledRow = self.item.pooled
        return row.response(self.outputs, model)


@dataclass
class Pending:
    """The engine requests of the pooled rows in flight: which row each belongs to, and the
    outputs gathered so far. ``macbatch run`` and the server's Batch API both queue and settle
    pooled rows here, each with its own engine's ``submit`` and ``abort``."""

    _rows: dict[str, tuple[Any, list[RequestOutput | None]]] = field(default_factory=dict)
    _request_rows: dict[str, tuple[str, int]] = field(default_factory=dict)

    def submit(
        self,
        item: Any,
        key: str,
        requests: Sequence[tuple[PromptInput, PoolingParams]],
        submit: Submit,
        abort: Abort,
    ) -> list[str]:
        """Queue all of a row's requests or none: one that cannot be queued (``ValueError``:
        too long, ...) aborts those queued before it and raises."""
        request_ids: list[str] = []
        try:
            for prompt, params in requests:
                request_ids.append(submit(prompt, params))
        except Exception:
            for request_id in request_ids:
                abort(request_id)
            raise
        self._rows[key] = (item, [None] * len(request_ids))
        for index, request_id in enumerate(request_ids):
            self._request_rows[request_id] = (key, index)
        return request_ids

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._request_rows

    def settle(self, output: RequestOutput, abort: Abort) -> Settled | None:
        """Record a final output: the row once its last output is in, or once one of its
        requests failed (the others are aborted). None: more to come, the row was aborted (not
        done, so a resume runs it again), or it had failed already."""
        key, index = self._request_rows.pop(output.request_id)
        row = self._rows.get(key)
        if row is None:
            return None
        item, outputs = row
        reason = output.finish_reason
        if reason is not FinishReason.STOP:
            del self._rows[key]
            for sibling in [r for r, (k, _) in self._request_rows.items() if k == key]:
                abort(sibling)
            if reason is FinishReason.ABORT:
                return None
            return Settled(item, [], output.error or f"finished with {reason}")
        outputs[index] = output
        if any(o is None for o in outputs):
            return None
        del self._rows[key]
        return Settled(item, [o for o in outputs if o is not None])
