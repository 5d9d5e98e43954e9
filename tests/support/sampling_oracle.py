"""The chi-square oracle of speculative sampling: the second tokens of many seeded replies to one
prompt, given the most common first token, follow the target's own distribution (mlx-lm's
forward, or mlx-vlm's, at temperature 1, scipy's chi-square at significance 0.001)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from scipy.stats import chisquare


def assert_sampled_after_a_draft_follow(engine: Any, model: nn.Module, prompt: list[int]) -> None:
    """400 seeded requests of ``prompt`` at temperature 1 through a speculating ``engine``
    (``model``: its target), each second token verified against a draft: given the first
    token, the second follows the target's distribution."""
    from macbatch.engine import SamplingParams

    params = [
        SamplingParams(max_tokens=3, ignore_eos=True, temperature=1.0, seed=seed)
        for seed in range(400)
    ]
    outputs = [o.token_ids for o in engine.generate([prompt] * len(params), params)]
    assert engine.stats().speculation.verifications >= len(params)  # every second token
    assert_second_tokens_follow(model, prompt, outputs)


def assert_second_tokens_follow(
    model: nn.Module, prompt: list[int], outputs: list[list[int]]
) -> None:
    firsts = [o[0] for o in outputs]
    first = max(set(firsts), key=firsts.count)
    seconds = [o[1] for o in outputs if o[0] == first]
    out = model(mx.array([prompt + [first]]))
    logits = getattr(out, "logits", out)[0, -1].astype(mx.float32)  # mlx-vlm's: an output
    probs = np.array(mx.softmax(logits)).astype(np.float64)
    probs /= probs.sum()
    counts = np.bincount(seconds, minlength=len(probs)).astype(float)
    keep = probs * len(seconds) >= 5  # chi-square's cells; the rest pooled into one
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(probs[keep], probs[~keep].sum()) * len(seconds)
    assert chisquare(observed, expected).pvalue > 0.001
