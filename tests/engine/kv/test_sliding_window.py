"""Sliding-window layers hold only their window (the window cache group): outputs equal mlx-lm's
own greedy generation through chunked prefill, joins, preemption and prefix-cache hits, and the
KV bytes a long request holds fall to the full layers plus the windows."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.window import DUMMY_BLOCK, SlidingWindowGroup
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import GREEDY, run_staggered
from tests.support.staggered import random_prompts as _prompts
from tests.support.tiny import build_model

WINDOWED = ["gemma3_text", "gpt_oss"]  # tiny configs: sliding_window 8


def _window(engine: Engine) -> SlidingWindowGroup:
    window = engine.kv.group(SlidingWindowGroup)
    assert window is not None
    return window


def _held(engine: Engine, request_id: str) -> int:
    return sum(b != DUMMY_BLOCK for b in _window(engine).block_table(request_id))


@pytest.mark.parametrize("arch", WINDOWED)
def test_window_group_holds_only_the_window(arch, tiny_tokenizer):
    model = build_model(arch)
    config = EngineConfig(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    engine = Engine(model, tiny_tokenizer, config)
    assert engine.runner.adapter.window == 8 and engine.runner.window_store is not None
    assert len(engine.runner.store.keys) + len(engine.runner.window_store.keys) == len(
        engine.runner.adapter.layer_shapes
    )
    [prompt] = _prompts([70], seed=5)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    rid = engine.add_request(prompt, params)
    most, final = 0, None
    while engine.has_unfinished():
        if engine.kv.block_table(rid):
            # the window before the last block boundary, and the chunk being computed
            most = max(most, _held(engine, rid))
            assert len(_window(engine).block_table(rid)) == len(engine.kv.block_table(rid))
        for out in engine.step():
            if out.finished:
                final = out
    assert final is not None and final.token_ids == mlx_lm_greedy(model, prompt, 30)
    assert most <= (8 + 16) // 8 + 2, most
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", WINDOWED)
def test_staggered_joins_and_long_prompts(arch, tiny_tokenizer):
    """Joins at different steps, prompts up to 14 windows long chunked over 24-token steps."""
    model = build_model(arch)
    engine = Engine(
        model, tiny_tokenizer, EngineConfig(num_blocks=96, block_size=8, max_num_batched_tokens=24)
    )
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = _prompts([112, 5, 37, 9, 60, 23], seed=7)
    results = run_staggered(engine, prompts, params)
    for i, prompt in enumerate(prompts):
        assert results[i] == mlx_lm_greedy(model, prompt, params.max_tokens), f"request {i}"
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", WINDOWED)
def test_preemption_with_prefix_cache(arch, tiny_tokenizer):
    """A pool too small for everyone preempts; the preempted resume from whatever both groups
    still have cached; outputs are unchanged."""
    model = build_model(arch)
    config = EngineConfig(num_blocks=12, block_size=8, max_num_batched_tokens=64)
    engine = Engine(model, tiny_tokenizer, config)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = _prompts([20, 18, 22, 15, 19], seed=3)
    outs = engine.generate(prompts, params)
    assert engine.stats().preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens)
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", WINDOWED)
def test_conversation_hits_the_cache_in_both_groups(arch, tiny_tokenizer):
    """Each turn resends the conversation: it resumes where the previous turn ended, where the
    window group still has the window cached."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=128, block_size=8))
    conversation = _prompts([13], seed=1)[0]
    hits = []
    for turn in range(5):
        [out] = engine.generate([conversation], GREEDY)
        assert out.token_ids == mlx_lm_greedy(model, conversation, GREEDY.max_tokens), turn
        hits.append(out.metrics.cached_tokens)
        conversation = conversation + out.token_ids + _prompts([5], seed=20 + turn)[0]
    assert all(hit > 0 for hit in hits[1:]), hits
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", WINDOWED)
def test_shared_prefix_is_shared_only_with_its_window(arch, tiny_tokenizer):
    """Prompts that share a prefix the first request ran past: the window blocks it gave back
    stay in the cache, so both groups resume the shared part; outputs equal mlx-lm's, and a
    prompt extending the first whole is served from the cache."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=128, block_size=8))
    system = _prompts([45], seed=0)[0]
    prompts = [system + tail for tail in _prompts([3, 6, 9, 4], seed=10)]
    [first] = engine.generate(prompts[:1], GREEDY)
    extended = prompts[0] + first.token_ids + [5, 6, 7]
    outs = engine.generate(prompts[1:] + [extended], GREEDY)
    for prompt, out in zip(prompts[1:] + [extended], outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)
    assert all(out.metrics.cached_tokens == 40 for out in outs[:-1])  # 5 of the 8-token blocks
    assert outs[-1].metrics.cached_tokens >= len(prompts[0]) + len(first.token_ids) - 8
    assert_pool_idle(engine)


def test_long_gemma3_request_holds_the_full_layers_and_the_windows(tiny_tokenizer):
    """A 2,000-token request on a Gemma 3-shaped model (one full layer in six, windows of 512):
    while it decodes, the KV bytes it holds are at most 45% of every layer at full length (the
    window blocks it gave back are idle in the prefix cache, the first reused)."""
    model = build_model(
        "gemma3_text", num_hidden_layers=6, sliding_window=512, sliding_window_pattern=6
    )
    config = EngineConfig(block_size=16, max_num_batched_tokens=256)
    engine = Engine(model, tiny_tokenizer, config)
    [prompt] = _prompts([2000], seed=2)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    engine.add_request(prompt, params)
    decoding = []
    while engine.has_unfinished():
        engine.step()
        stats = engine.stats()
        if stats.running and stats.tokens_last_step == 1:
            decoding.append(_held_bytes(engine))
    full_length = engine.info.model.kv_bytes_per_token * 2000
    assert decoding and max(decoding) <= 0.45 * full_length, max(decoding) / full_length


def _held_bytes(engine: Engine) -> int:
    """Bytes of the pages requests hold in both groups (not idle prefix-cache blocks)."""
    held = (
        engine.kv.pool.num_blocks - engine.kv.pool.num_free
    ) * engine.runner.store.bytes_per_block
    window = engine.kv.group(SlidingWindowGroup)
    if window is not None:
        held += (window.pool.num_blocks - window.pool.num_free) * window.spec.bytes_per_block
    return held
