"""Prompt lookup: drafts copied from the request's own prompt and output.

Extraction, summarisation, code edits and RAG answers repeat long runs of their input. When the
last few tokens of a sequence occurred before in it, the tokens that followed them then are a
free guess at what follows now: no model runs, and a wrong guess costs only the rows it adds to
the step's forward.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import mlx.core as mx

    from macbatch.engine.core.request import Request
    from macbatch.engine.core.scheduler import ScheduledChunk


class NgramDrafter:
    """Matches the last ``max_ngram`` tokens (then fewer, down to ``min_ngram``) against the
    sequence and proposes what followed the most recent earlier match with k tokens after it."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, requests: Sequence[Request], ks: Sequence[int]) -> list[list[int]]:
        return [self.lookup(r.all_token_ids, k) for r, k in zip(requests, ks)]

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the sequence's
        longest matching suffix ([] when no suffix of ``min_ngram`` tokens occurred before)."""
        seq = np.asarray(tokens, dtype=np.int64)
        size = len(seq)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            suffix = seq[size - n :]
            # candidate starts: every earlier window of n tokens (not the suffix itself)
            starts = np.flatnonzero(seq[: size - n] == suffix[0])
            for j in range(1, n):
                starts = starts[seq[starts + j] == suffix[j]]
            if starts.size:
                # the latest match followed by k tokens, else the earliest (the most follow it)
                full = starts[starts + n + k <= size]
                begin = int(full[-1] if full.size else starts[0]) + n
                return [int(t) for t in seq[begin : begin + k]]
        return []

    def observe(
        self, chunks: Sequence[ScheduledChunk], hidden: mx.array, drafting: Set[str]
    ) -> list[mx.array]:
        return []  # drafts from the tokens alone

    def truncated(self, request_id: str, num_tokens: int) -> None:
        """Nothing is kept per request."""

    def forget(self, request_id: str) -> None:
        """Nothing is kept per request."""
