"""Phi-3's LongRoPE chosen per request as transformers chooses it (model/hooks/long_rope.py).

The oracle is mlx-lm's own Phi-3, one sequence at a time, its ropes' factors set by the
reference's rule (transformers' dynamic ``longrope`` update): a prompt longer than the original
positions is rotated long throughout; a shorter one, and each token decoded at a position below
them, short; a token at or past them long, the keys before it as cached.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.tiny import TINY_COMMON, save_model

ORIGINAL = 32  # original positions: the prompts and decodes below cross it
_ROTARY = 12  # three quarters of each 16-wide head
_rng = random.Random(3)
PHI3 = dict(
    TINY_COMMON,
    model_type="phi3",
    partial_rotary_factor=0.75,
    max_position_embeddings=4 * ORIGINAL,
    original_max_position_embeddings=ORIGINAL,
    rope_scaling={
        "type": "longrope",
        "short_factor": [round(_rng.uniform(1.0, 3.0), 3) for _ in range(_ROTARY // 2)],
        "long_factor": [round(_rng.uniform(3.0, 12.0), 3) for _ in range(_ROTARY // 2)],
    },
)


@pytest.fixture(scope="module")
def phi3_path(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("phi3") / "phi3", arch="llama", **PHI3)


def _set_factors(model, long: bool) -> None:
    """Every layer's rope rotated by the long or the short factors (mlx-lm keeps the long)."""
    scaling = PHI3["rope_scaling"]
    factors = scaling["long_factor" if long else "short_factor"]
    base = PHI3["rope_theta"] ** (mx.arange(0, _ROTARY, 2, dtype=mx.float32) / _ROTARY)
    for layer in model.layers:
        layer.self_attn.rope._freqs = mx.array(factors, dtype=mx.float32) * base


def reference_greedy(model, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities of one sequence by transformers' rule."""
    cache = make_prompt_cache(model)
    _set_factors(model, len(prompt) > ORIGINAL)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    tokens: list[int] = []
    logprobs: list[float] = []
    position = len(prompt)
    while True:
        scores = logits - mx.logsumexp(logits)
        tokens.append(int(mx.argmax(scores)))
        logprobs.append(float(scores[tokens[-1]]))
        if len(tokens) == max_tokens:
            return tokens, logprobs
        _set_factors(model, len(prompt) > ORIGINAL or position >= ORIGINAL)
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
        position += 1


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, PHI3["vocab_size"]) for _ in range(length)]


def _run_staggered(engine: Engine, prompts: list[list[int]], max_tokens: int) -> dict:
    """Each prompt added two steps after the one before, every request run to its end."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=0)
    done, waiting = {}, list(enumerate(prompts))
    while waiting or engine.has_unfinished():
        if waiting:
            index, prompt = waiting.pop(0)
            engine.add_request(prompt, params, request_id=str(index))
        for _ in range(2):
            for out in engine.step():
                if out.finished:
                    done[int(out.request_id)] = out
    return done


@pytest.mark.parametrize("compiled", [False, True])
def test_requests_of_both_kinds_in_one_engine_match_the_reference(phi3_path, compiled):
    # below, at and past the original positions; short ones decode past them
    lengths = [20, 40, 32, 9, 31, 50]
    prompts = [_prompt(n, seed) for seed, n in enumerate(lengths)]
    config = dict(max_num_batched_tokens=24, compile_decode_after=1 if compiled else None)
    engine = Engine.load(str(phi3_path), EngineConfig(num_blocks=64, **config))
    done = _run_staggered(engine, prompts, max_tokens=28)
    if compiled:
        assert engine.runner.compiled is not None and engine.runner.compiled.compiled_shapes
    model, _ = load(str(phi3_path))
    for index, prompt in enumerate(prompts):
        tokens, logprobs = reference_greedy(model, prompt, 28)
        assert done[index].token_ids == tokens, f"prompt of {len(prompt)} tokens"
        assert done[index].logprobs == pytest.approx(logprobs, abs=1e-4)


def test_a_long_prompt_reads_no_short_prompts_cached_blocks(phi3_path):
    shared = _prompt(40, seed=11)
    short, long = shared[:24], shared  # the first block (16 tokens) is the same
    engine = Engine.load(str(phi3_path), EngineConfig(num_blocks=64))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    (first,) = engine.generate([short], params)
    (second,) = engine.generate([long], params)
    (again,) = engine.generate([long], params)  # a long prompt's blocks serve a long one
    model, _ = load(str(phi3_path))
    assert first.token_ids == reference_greedy(model, short, 6)[0]
    assert second.token_ids == reference_greedy(model, long, 6)[0]
    assert second.metrics.cached_tokens == 0
    assert again.token_ids == second.token_ids and again.metrics.cached_tokens == 32
