"""Requests that join a running batch at different steps, and random prompts for them: the
workload the parity tests hold the engine to against mlx-lm's single-request generation."""

from __future__ import annotations

import numpy as np

from macbatch.engine import Engine, SamplingParams
from tests.support.tiny import VOCAB_SIZE

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def random_prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in lengths]


def run_staggered(engine: Engine, prompts, params, join_every: int = 2) -> dict[int, list[int]]:
    """Add request i after i * join_every steps, so requests join a batch already running."""
    results: dict[int, list[int]] = {}
    ids: dict[str, int] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished():
        while pending and step >= pending[0][0] * join_every:
            i, prompt = pending.pop(0)
            ids[engine.add_request(prompt, params)] = i
        for out in engine.step():
            if out.finished:
                results[ids[out.request_id]] = out.token_ids
        step += 1
    return results
