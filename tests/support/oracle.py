"""mlx-lm's own single-request generation: the oracle the engine is compared against."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step


def mlx_lm_greedy(model: nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens from mlx-lm for one prompt (EOS not treated specially)."""
    return [token for token, _ in mlx_lm_greedy_logprobs(model, prompt, max_tokens)]


def mlx_lm_greedy_logprobs(
    model: nn.Module, prompt: list[int], max_tokens: int
) -> list[tuple[int, float]]:
    """Greedy tokens from mlx-lm for one prompt, each with its log-probability."""
    steps = []
    for token, logprobs in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        steps.append((int(token), float(logprobs[int(token)])))
        if len(steps) == max_tokens:
            break
    return steps


def assert_pool_idle(engine) -> None:
    """Every KV block is back: free, or idle in the prefix cache; nothing leaked."""
    pool = engine.pool
    assert (pool.refcounts == 0).all(), f"blocks still referenced: {pool.refcounts.nonzero()}"
    assert pool.num_free == pool.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting
