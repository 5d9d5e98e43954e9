"""mlx-lm's own single-request generation: the oracle the engine is compared against."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from macbatch.engine.kv.recurrent_state import RecurrentStateGroup
from macbatch.engine.kv.window import SlidingWindowGroup
from tests.support.attention_numpy import dequantize_numpy, quantize_numpy
from tests.support.fp8_numpy import round_indexer_keys


def mlx_lm_greedy(
    model: nn.Module, prompt: list[int], max_tokens: int, kv_bits: int | None = None,
    kv_group_size: int = 64, indexer_keys: str | None = None,
) -> list[int]:  # fmt: skip
    """Greedy tokens from mlx-lm for one prompt (EOS not treated specially); ``kv_bits`` and
    ``indexer_keys`` as in ``mlx_lm_greedy_logprobs``."""
    steps = mlx_lm_greedy_logprobs(model, prompt, max_tokens, kv_bits, kv_group_size, indexer_keys)
    return [token for token, _ in steps]


def mlx_lm_greedy_logprobs(
    model: nn.Module, prompt: list[int], max_tokens: int, kv_bits: int | None = None,
    kv_group_size: int = 64, indexer_keys: str | None = None,
) -> list[tuple[int, float]]:  # fmt: skip
    """Greedy tokens from mlx-lm for one prompt, each with its log-probability.

    With ``kv_bits``, every K/V row mlx-lm caches is first rounded through the page format
    (numpy quantizer and dequantizer, ``tests/support/attention_numpy.py``), so mlx-lm attends
    over exactly the values quantized pages hold, in its own float cache and attention; with
    ``indexer_keys`` "fp8", its indexer's keys through the fp8 format
    (``tests/support/fp8_numpy.py``; in place of ``kv_bits``' rounding there, as the engine's
    fp8 key pages are fp8 whatever the latent's format).
    """
    cache = make_prompt_cache(model)
    if kv_bits is not None:
        for layer_cache in cache:  # a recurrent layer's state is never paged: not rounded
            # a CacheList's parts each (DeepSeek V3.2's latent and indexer-key caches)
            for part in getattr(layer_cache, "caches", (layer_cache,)):
                if hasattr(part, "update_and_fetch"):
                    _round_writes(part, kv_bits, kv_group_size)
    if indexer_keys == "fp8":
        round_indexer_keys(model.layers, cache)
    steps = []
    for token, logprobs in generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, prompt_cache=cache
    ):
        steps.append((int(token), float(logprobs[int(token)])))
        if len(steps) == max_tokens:
            break
    return steps


def assert_matches_mlx_lm(
    model: nn.Module, prompt: list[int], out, kv_bits: int | None = None
) -> None:
    """``out`` (asked with ``logprobs=0``) has mlx-lm's greedy tokens and, to float32
    tolerance, their log-probabilities: tiny random models often keep their greedy tokens over
    wrong K/V (even all zeros), so the ids alone cannot tell a wrong block from a right one.
    Quantized pages: the engine dequantizes inside its attention, mlx-lm attends over rounded
    float rows, so their sums differ in the last bits (3e-4 measured with 8-bit pages)."""
    abs_tol = 1e-4 if kv_bits is None else 1e-3
    want = mlx_lm_greedy_logprobs(model, prompt, len(out.token_ids), kv_bits)
    assert out.token_ids == [token for token, _ in want]
    expected = [lp for _, lp in want]
    worst = max((abs(a - b) for a, b in zip(out.logprobs, expected)), default=0.0)
    assert out.logprobs == pytest.approx(expected, abs=abs_tol), f"off by up to {worst}"


def _round_writes(layer_cache, bits: int, group_size: int) -> None:
    write = layer_cache.update_and_fetch

    def rounded(x: mx.array) -> mx.array:
        size = min(group_size, x.shape[-1])
        codes, scales = quantize_numpy(np.array(x.astype(mx.float32)), bits, size)
        return mx.array(dequantize_numpy(codes, scales, bits).astype(np.float32)).astype(x.dtype)

    layer_cache.update_and_fetch = lambda keys, values: write(rounded(keys), rounded(values))


def assert_pool_idle(engine) -> None:
    """Every KV block is back: free, or idle in the prefix cache; nothing leaked."""
    window = engine.kv.group(SlidingWindowGroup)
    for pool in (engine.kv.pool, None if window is None else window.pool):  # the window group's too
        if pool is None:
            continue
        held = pool.refcounts.nonzero()
        assert (pool.refcounts == 0).all(), f"blocks still referenced: {held}"
        assert pool.num_free == pool.num_blocks
    state = engine.kv.group(RecurrentStateGroup)
    assert state is None or state.slots_in_use == 0, "recurrent-state slots still held"
    assert not engine.scheduler.running and not engine.scheduler.waiting


def assert_mixed_batch_exact(engine, model: nn.Module, prompts: list, max_tokens: int) -> None:
    """Every third request opts out of speculation beside ones that speculate; every reply is
    mlx-lm's, some drafts held, and ``engine``'s pool (sized by the caller) preempted and hit
    its prefix cache."""
    from macbatch.engine import SamplingParams

    requests = [
        SamplingParams(
            max_tokens=max_tokens, temperature=0, ignore_eos=True, speculative=i % 3 != 1
        )
        for i in range(len(prompts))
    ]
    outputs = [o.token_ids for o in engine.generate(prompts, requests)]
    assert outputs == [mlx_lm_greedy(model, p, max_tokens) for p in prompts]
    stats = engine.stats()
    assert stats.speculation.accepted > 0
    assert stats.preemptions > 0 and stats.prefix_cache_hit_rate > 0
    assert_pool_idle(engine)


def layer_outputs(model: nn.Module, tokens: list[int]) -> list[mx.array]:
    """The outputs ``[1, len, H]`` of each decoder layer of a dense ``model`` over ``tokens``,
    run layer by layer over mlx-lm's causal mask (what a feature-reading drafter fuses)."""
    from mlx_lm.models.base import create_attention_mask

    from macbatch.engine.model.adapter import text_model

    inner = text_model(model).model
    h = inner.embed_tokens(mx.array([tokens]))
    mask = create_attention_mask(h, None)
    outputs = []
    for layer in inner.layers:
        h = layer(h, mask, None)
        outputs.append(h)
    return outputs
