"""Pooling requests: a prompt in, one vector (or one relevance score) out, never sampled.

A pooling request is prefilled like any prompt (in the same packed step as generation requests,
chunked when long); each of its chunks hands its rows of the last layer's normed hidden states to
its pooling method, which keeps what it needs across chunks on the device (a running sum for
mean pooling). When its last chunk is dispatched the request's blocks go back at once, and the
result is read with the step. Methods are entries of ``POOLING_METHODS`` (one small class each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx


class PoolingMethod(Protocol):
    """How a sequence's hidden states become one vector, chunk by chunk (rows: [n, H] in the
    model's dtype; a sum is kept in float32)."""

    # Whether a request may start from cached prefix blocks (their rows are never computed).
    reads_cached_prefix: bool

    def take(self, acc: mx.array | None, rows: mx.array, first: bool, last: bool) -> mx.array:
        """The accumulator after a chunk (``first``: it starts the sequence; ``last``: ends it)."""
        ...

    def result(self, acc: mx.array, num_tokens: int) -> mx.array: ...


class LastToken:
    """The last token's state: what decoder embedding models (Qwen3-Embedding) train for."""

    reads_cached_prefix = True

    def take(self, acc: mx.array | None, rows: mx.array, first: bool, last: bool) -> mx.array:
        return rows[-1] if last or acc is None else acc

    def result(self, acc: mx.array, num_tokens: int) -> mx.array:
        return acc


class FirstToken:
    """The first token's state (BERT's CLS pooling)."""

    reads_cached_prefix = False

    def take(self, acc: mx.array | None, rows: mx.array, first: bool, last: bool) -> mx.array:
        return rows[0] if first or acc is None else acc

    def result(self, acc: mx.array, num_tokens: int) -> mx.array:
        return acc


class Mean:
    """The mean over every token: a running sum carried across chunks, divided at the end."""

    reads_cached_prefix = False

    def take(self, acc: mx.array | None, rows: mx.array, first: bool, last: bool) -> mx.array:
        total = rows.astype(mx.float32).sum(axis=0)
        return total if first or acc is None else acc + total

    def result(self, acc: mx.array, num_tokens: int) -> mx.array:
        return acc / num_tokens


POOLING_METHODS: dict[str, PoolingMethod] = {
    "last": LastToken(),
    "cls": FirstToken(),
    "mean": Mean(),
}


@dataclass(frozen=True)
class PoolingParams:
    """What a pooling request asks for. ``method`` None: the model's default (its
    sentence-transformers pooling config, else last-token); the input processor fills both
    defaults in from the model's ``EmbeddingProfile``. ``dimensions``: keep the first n
    (Matryoshka), before normalizing. ``truncate``: cut a prompt longer than the context to
    its first tokens instead of refusing it. ``score_tokens`` (yes, no): a cross-encoder's
    relevance, P(yes) of the softmax over those two logits at the last position. ``lexical``
    and ``colbert``: BGE-M3's sparse weights and multi-vectors too (an encoder with its heads)."""

    method: str | None = None
    normalize: bool | None = None  # None: as the model does (a Normalize module), else True
    dimensions: int | None = None
    truncate: bool = False
    score_tokens: tuple[int, int] | None = None
    lexical: bool = False
    colbert: bool = False

    def __post_init__(self) -> None:
        if self.method is not None and self.method not in POOLING_METHODS:
            names = ", ".join(POOLING_METHODS)
            raise ValueError(f"pooling method must be one of {names}; got {self.method!r}")
        if self.dimensions is not None and (
            not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")
        if self.score_tokens is not None and self.method not in (None, "last"):
            raise ValueError("a relevance score is read at the last position: method 'last'")

    @property
    def pooling_method(self) -> PoolingMethod:
        return POOLING_METHODS[self.method or "last"]


@dataclass(frozen=True)
class PoolSpan:
    """One pooling request's chunk in a packed step: its rows, and where it lies in the prompt."""

    request_id: str
    params: PoolingParams
    row_start: int
    row_end: int
    first: bool
    last: bool
    num_tokens: int  # the whole prompt's


Head = Callable[[mx.array], mx.array]  # normed hidden [R, 1, H] -> logits [R, V] float32


class Pools:
    """The pooling requests' accumulators (device arrays, the engine thread's only)."""

    def __init__(self) -> None:
        self._acc: dict[str, mx.array] = {}

    def take(self, hidden: mx.array, spans: Sequence[PoolSpan], head: Head) -> dict[str, mx.array]:
        """Fold a step's rows into each span's accumulator; returns the results of the spans
        that end their prompt (their accumulators are dropped)."""
        done: dict[str, mx.array] = {}
        for span in spans:
            rows = hidden[span.row_start : span.row_end, 0, :]
            method = span.params.pooling_method
            acc = method.take(self._acc.get(span.request_id), rows, span.first, span.last)
            if not span.last:
                self._acc[span.request_id] = acc
                continue
            self._acc.pop(span.request_id, None)
            done[span.request_id] = _finish(method.result(acc, span.num_tokens), span.params, head)
        return done

    def arrays(self) -> list[mx.array]:
        """The accumulators to evaluate with the step (so no graph grows across chunks)."""
        return list(self._acc.values())

    def drop(self, request_id: str) -> None:
        """Forget a request's accumulator (it finished, or was aborted)."""
        self._acc.pop(request_id, None)


def _finish(vector: mx.array, params: PoolingParams, head: Head) -> mx.array:
    if params.score_tokens is not None:
        logits = head(vector[None, None, :])[0]  # the last row, in the model's dtype
        pair = logits[mx.array(params.score_tokens)]
        return mx.softmax(pair, axis=-1)[:1]  # P(yes)
    vector = vector.astype(mx.float32)
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    if params.normalize:
        vector = vector / mx.maximum(mx.linalg.norm(vector), 1e-12)
    return vector
