"""Requests without a model or tokenizer, for model-free tests of the scheduler and KV manager
(the pattern of vLLM's tests/v1/core)."""

from __future__ import annotations

import itertools

from macbatch.engine.core.outputs import RequestMetrics
from macbatch.engine.core.request import Request
from macbatch.engine.sample.params import SamplingParams

_ids = itertools.count()


def make_request(
    prompt: list[int] | int, max_tokens: int = 16, request_id: str | None = None
) -> Request:
    """A request for ``prompt`` (token ids, or a length: tokens 1..n)."""
    tokens = list(range(1, prompt + 1)) if isinstance(prompt, int) else list(prompt)
    return Request(
        request_id=request_id or f"r{next(_ids)}",
        prompt_token_ids=tokens,
        params=SamplingParams(max_tokens=max_tokens, temperature=0),
        seed=0,
        eos_token_ids=frozenset(),
        detokenizer=None,  # text is never read in these tests
        metrics=RequestMetrics(arrival_time=0.0, prompt_tokens=len(tokens)),
    )
