"""Prefix caching: shared KV blocks give the same outputs as recomputing, and the pool's
reference counts stay exact."""

from __future__ import annotations

import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.oracle import assert_pool_idle
from tests.support.tiny import VOCAB_SIZE, build_model

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3")


def _engines(model, tokenizer, **config):
    return [
        Engine(model, tokenizer, EngineConfig(enable_prefix_caching=on, **config))
        for on in (True, False)
    ]


def _tokens(n, seed):
    return np.random.default_rng(seed).integers(3, VOCAB_SIZE, size=n).tolist()


def test_shared_system_prompt(model, tiny_tokenizer):
    cached, plain = _engines(model, tiny_tokenizer, num_blocks=128, block_size=8)
    system = _tokens(45, 0)  # 5 full blocks and a partial one
    prompts = [system + _tokens(3 + i, 10 + i) for i in range(12)]
    first = cached.generate(prompts[:1], GREEDY)  # warms the cache
    rest = cached.generate(prompts[1:], GREEDY)
    want = plain.generate(prompts, GREEDY)
    assert [o.token_ids for o in first + rest] == [o.token_ids for o in want]
    assert all(o.metrics.cached_tokens == 40 for o in rest)
    assert cached.stats().prefix_cache_hit_rate > 0.6
    assert plain.stats().prefix_cache_hit_rate == 0
    assert_pool_idle(cached)


def test_multi_turn_conversation(model, tiny_tokenizer):
    """Each turn resends the conversation; every turn reuses everything computed before."""
    cached, plain = _engines(model, tiny_tokenizer, num_blocks=128, block_size=8)
    conversation = _tokens(13, 1)
    previous_len = 0
    for turn in range(5):
        ours, theirs = (
            cached.generate([conversation], GREEDY)[0],
            plain.generate([conversation], GREEDY)[0],
        )
        assert ours.token_ids == theirs.token_ids
        if previous_len:
            # Everything but the partial last block of the previous turn's tokens is reused.
            assert ours.metrics.cached_tokens >= previous_len - 8
        previous_len = len(conversation) + len(ours.token_ids) - 1
        conversation = conversation + ours.token_ids + _tokens(5, 100 + turn)
    assert_pool_idle(cached)


def test_prefix_ending_mid_block_and_whole_prompt_cached(model, tiny_tokenizer):
    """Prompts that share 11 tokens (a block and a half) and an identical prompt whose every
    block is cached: at least one token is always computed to have logits."""
    cached, plain = _engines(model, tiny_tokenizer, num_blocks=64, block_size=8)
    base = _tokens(16, 2)
    prompts = [base, base[:11] + _tokens(9, 3), list(base)]
    outs = [cached.generate([p], GREEDY)[0] for p in prompts]
    want = plain.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert [o.metrics.cached_tokens for o in outs] == [0, 8, 8]
    assert_pool_idle(cached)


def test_hits_on_blocks_being_evicted_and_preemption(model, tiny_tokenizer):
    """A pool so small that cached blocks are evicted and shared requests are preempted."""
    cached, plain = _engines(
        model, tiny_tokenizer, num_blocks=14, block_size=8, max_num_batched_tokens=32
    )
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    system = _tokens(24, 4)
    prompts = [system + _tokens(6, 20 + i) for i in range(6)] + [_tokens(30, 40)]
    outs = cached.generate(prompts, params)
    want = plain.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert cached.stats().preemptions > 0
    assert sum(o.metrics.cached_tokens for o in outs) > 0
    assert_pool_idle(cached)


def test_refcounts_exact_under_random_traffic(model, tiny_tokenizer):
    """Random adds, aborts and steps: at every step each block's reference count equals the
    number of live requests holding it; at the end every block is free or cached."""
    rng = np.random.default_rng(7)
    engine = Engine(
        model,
        tiny_tokenizer,
        EngineConfig(num_blocks=14, block_size=8, max_num_batched_tokens=20, max_num_seqs=6),
    )
    prefixes = [_tokens(20, 50 + i) for i in range(3)]
    live: list[str] = []
    for _ in range(150):
        action = rng.random()
        if action < 0.3:
            prompt = prefixes[rng.integers(3)][: rng.integers(1, 21)] + _tokens(
                int(rng.integers(1, 6)), int(rng.integers(1000))
            )
            params = SamplingParams(max_tokens=int(rng.integers(1, 12)), temperature=0)
            live.append(engine.add_request(prompt, params))
        elif action < 0.4 and live:
            engine.abort(live.pop(int(rng.integers(len(live)))))
        for out in engine.step():
            if out.finished and out.request_id in live:
                live.remove(out.request_id)
        held = np.zeros(engine.kv.pool.num_blocks, dtype=np.int32)
        for request in engine.scheduler.running + list(engine.scheduler.waiting):
            np.add.at(held, engine.kv.block_table(request.request_id), 1)
        np.testing.assert_array_equal(held, engine.kv.pool.refcounts)
    while engine.has_unfinished():
        engine.step()
    assert_pool_idle(engine)
