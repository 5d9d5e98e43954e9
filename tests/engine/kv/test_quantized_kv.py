"""Quantized KV pages in the engine: greedy tokens equal mlx-lm's when mlx-lm's own cache holds the
same quantized values (rounded through the numpy quantizer), under batching, chunked prefill,
sliding windows, sinks, GQA, preemption and prefix caching; writes round-trip the format exactly;
the pool's true size; clear errors for bad settings."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.distributed import loading
from macbatch.engine.stores.pages import KVStore, LayerShape, PageFormat
from tests.support.attention_numpy import quantize_numpy
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import GREEDY, run_staggered
from tests.support.staggered import random_prompts as _prompts
from tests.support.tiny import build_model, save_model


@pytest.mark.parametrize(
    "arch,bits",
    [("qwen3", 8), ("qwen3", 4), ("gemma3_text", 8), ("gemma3_text", 4), ("gpt_oss", 4)],
)
def test_staggered_batch_matches_mlx_lm_on_the_same_quantized_values(arch, bits, tiny_tokenizer):
    """GQA 2 (qwen3), sliding windows (gemma3), sinks + window (gpt_oss); nine requests joining
    a running batch with chunked prefill. Float KV gives other tokens for these models, so the
    comparison sees the quantization."""
    model = build_model(arch)
    config = EngineConfig(num_blocks=96, block_size=8, max_num_batched_tokens=24, kv_bits=bits)
    engine = Engine(model, tiny_tokenizer, config)
    prompts = _prompts([1, 5, 37, 12, 3, 60, 8, 25, 2])
    results = run_staggered(engine, prompts, GREEDY)
    for i, prompt in enumerate(prompts):
        assert results[i] == mlx_lm_greedy(model, prompt, GREEDY.max_tokens, kv_bits=bits), i
    assert_pool_idle(engine)


def test_preemption_and_prefix_caching_with_4bit_pages(tiny_tokenizer):
    """A pool too small for everyone (preemption, recompute) and prompts sharing a prefix
    (cached quantized blocks reused) give mlx-lm's tokens."""
    model = build_model("qwen3")
    config = EngineConfig(num_blocks=14, block_size=8, max_num_batched_tokens=64, kv_bits=4)
    engine = Engine(model, tiny_tokenizer, config)
    shared = _prompts([24], seed=5)[0]
    prompts = [shared + p for p in _prompts([3, 9, 1, 6, 4], seed=3)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outs = engine.generate(prompts[:1], params) + engine.generate(prompts[1:], params)
    stats = engine.stats()
    assert stats.preemptions > 0 and stats.prefix_cache_hit_rate > 0.3
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens, kv_bits=4)
    assert_pool_idle(engine)


@pytest.mark.parametrize("bits,group", [(8, None), (4, 32)])
def test_written_rows_round_trip_the_format_exactly(bits, group):
    """What the step's scatter writes is exactly the numpy quantizer's output, at the rows
    written; every other row stays as it was."""
    shapes = [LayerShape(num_kv_heads=2, head_dim=64)]
    store = KVStore(shapes, num_blocks=6, block_size=8, fmt=PageFormat(mx.float32, bits, group))
    rng = np.random.default_rng(bits)
    keys = (rng.standard_normal((5, 2, 64)) * 4).astype(np.float32)
    values = rng.standard_normal((5, 2, 64)).astype(np.float32)
    rows = np.array([3, 17, 40, 41, 90, 91, 60, 7, 33, 12], dtype=np.int32)  # scattered
    store.write(0, mx.array(rows), mx.array(keys), mx.array(values))
    mx.eval(store.arrays())
    k_pages, v_pages = store.pages(0)
    size = group or 64
    for pages, x in ((k_pages, keys), (v_pages, values)):
        codes = np.array(pages.codes).reshape(-1, 64 * bits // 8)
        scales = np.array(pages.scales).reshape(-1, 64 // size, 2)
        want_codes, want_scales = quantize_numpy(x.reshape(-1, 64), bits, size)
        np.testing.assert_array_equal(codes[rows], want_codes)
        np.testing.assert_array_equal(scales[rows], want_scales)
        untouched = np.setdiff1d(np.arange(len(codes)), rows)
        assert not codes[untouched].any() and not scales[untouched].any()


def test_pool_bytes_per_block_and_stats(tiny_tokenizer):
    """Bytes per block count codes and scales; the pool holds exactly that; at group size 64 a
    head dim of 128 fits 1.88x (8-bit) and 3.56x (4-bit) the tokens of float16 per byte."""
    shapes = [LayerShape(8, 128)] * 4
    per_block = {
        bits: PageFormat(mx.float16, bits).bytes_per_block(shapes, 16) for bits in (None, 8, 4)
    }
    assert per_block[None] == 4 * 2 * 8 * 16 * 128 * 2
    assert per_block[8] == 4 * 2 * 8 * 16 * (128 + 2 * 4)
    assert per_block[4] == 4 * 2 * 8 * 16 * (64 + 2 * 4)
    assert per_block[None] / per_block[8] >= 1.85 and per_block[None] / per_block[4] >= 3.4
    model = build_model("qwen3")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=32, kv_bits=4))
    fmt = engine.runner.store.format
    expected = 32 * fmt.bytes_per_block(engine.runner.store.shapes, 16)
    assert engine.stats().kv_cache_bytes == expected  # what is reported
    assert sum(a.nbytes for a in engine.runner.store.arrays()) == expected  # what is allocated


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(kv_bits=3), "kv_bits must be 8, 4 or None"),
        (dict(kv_bits=True), "kv_bits must be 8, 4 or None"),
        (dict(kv_bits="8"), "kv_bits must be 8, 4 or None"),
        (dict(kv_bits=8, kv_group_size=48), "kv_group_size must be 64 or 32"),
    ],
)
def test_bad_settings_fail_in_the_config(settings, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)


def test_group_size_that_does_not_divide_the_head_dim_fails_before_loading(tmp_path, monkeypatch):
    path = save_model(tmp_path / "m", "qwen3", head_dim=96)

    def never(name):
        raise AssertionError("the weights were loaded")

    # where Engine.load looks it up (patching engine.loader instead leaked ``never`` into later
    # tests whenever this test was the first to import engine.distributed.loading)
    monkeypatch.setattr(loading, "load_model", never)
    with pytest.raises(ValueError, match="does not divide the model's head dim 96; valid .*: 32"):
        Engine.load(str(path), EngineConfig(kv_bits=8, kv_group_size=64))
