"""The elastic KV pool: it grows under load before anyone is preempted, shrinks when idle keeping
the prefix cache it can, and outputs stay mlx-lm's greedy ones throughout."""

from __future__ import annotations

import threading
import time

import pytest

from macbatch.engine import Engine, EngineConfig, EngineThread, SamplingParams
from macbatch.engine.kv.block_pool import BlockPool
from macbatch.engine.worker import model_runner
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import random_prompts
from tests.support.tiny import build_model

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _elastic(max_num_seqs: int = 16, **overrides) -> EngineConfig:
    """No ``num_blocks``: the pool starts at one block per sequence (``kv_start_mib`` 0)."""
    base = dict(
        block_size=8, max_num_seqs=max_num_seqs, max_num_batched_tokens=64, kv_start_mib=0.0
    )
    return EngineConfig(**{**base, **overrides})


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_pool_grows_under_load_and_shrinks_when_idle(arch, tiny_tokenizer):
    """Twenty requests need far more than the 16 blocks the pool starts with: it grows (in
    segments, while steps are in flight) and nobody is preempted; idle, it shrinks back to 16
    blocks holding the most recently freed prefix-cache blocks, renumbered, which a prompt then
    hits. Every output equals mlx-lm's greedy generation, before and after."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, _elastic())
    start = engine.stats()
    assert start.kv_blocks_total == 16 < start.kv_blocks_cap
    per_block = start.kv_cache_bytes // 16
    assert start.kv_bytes_used == 0

    prompts = random_prompts([12, 40, 17, 60, 9, 33, 24, 51, 12, 10] * 2, seed=7)
    expected = [mlx_lm_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    sizes = set()
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        stats = engine.stats()
        sizes.add(stats.kv_blocks_total)
        assert stats.kv_cache_bytes == stats.kv_blocks_total * per_block
        assert stats.kv_bytes_used >= stats.kv_blocks_used * per_block
    grown = engine.stats()
    assert len(sizes) > 2 and max(sizes) <= grown.kv_blocks_cap  # grew in segments
    assert grown.preemptions == 0  # grown before anyone was preempted
    assert [outs[i].token_ids for i in ids] == expected
    assert grown.kv_bytes_used >= grown.cached_blocks * per_block > 0  # the prefix cache

    assert engine.shrink_pool() == grown.kv_blocks_total - 16
    idle = engine.stats()
    assert (idle.kv_blocks_total, idle.kv_cache_bytes) == (16, 16 * per_block)
    assert 0 < idle.cached_blocks <= 16
    assert_pool_idle(engine)

    # The request that finished last freed its blocks last: they are the ones kept.
    last = ids.index(list(outs)[-1])
    (hit,) = engine.generate([prompts[last]], GREEDY)
    assert hit.metrics.cached_tokens > 0 and hit.token_ids == expected[last]
    again = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in again] == expected
    assert_pool_idle(engine)


@pytest.mark.parametrize("kv_bits", [None, 8])
def test_growth_stops_at_the_cap_and_then_preempts(tiny_tokenizer, monkeypatch, kv_bits):
    """A cap too small for everyone (as memory would set it on a small machine: 12 blocks): the
    pool grows to it, then the scheduler preempts as with a fixed pool; outputs are unchanged,
    with float pages and with quantized ones (whose scales grow with their codes)."""
    monkeypatch.setattr(model_runner, "blocks_for_memory", lambda *args: 12)
    model = build_model("qwen3")
    config = _elastic(max_num_seqs=4, enable_prefix_caching=False, kv_bits=kv_bits)
    engine = Engine(model, tiny_tokenizer, config)
    assert (engine.stats().kv_blocks_total, engine.info.kv_blocks_cap) == (4, 12)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompts = random_prompts([20, 18, 22, 15, 19, 21], seed=3)
    outs = engine.generate(prompts, params)
    stats = engine.stats()
    assert stats.kv_blocks_total == stats.kv_blocks_cap and stats.preemptions > 0
    for prompt, out in zip(prompts, outs):
        # head dim 16: quantized pages keep one scale per row of 16
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens, kv_bits, 16)
    assert_pool_idle(engine)


def test_context_limit_uses_the_cap(tiny_tokenizer):
    """The context limit is the model's (the cap holds it) though the pool starts with one
    block; a prompt longer than the pool then is served, and max_tokens None fits the cap."""
    model = build_model("qwen3")
    engine = Engine(model, tiny_tokenizer, _elastic(max_num_seqs=1))
    assert engine.stats().kv_blocks_total == 1
    assert engine.info.kv_blocks_cap == 4096 // 8
    assert engine.context_limit() == 4096 == engine.info.context_limit
    assert engine.info.context_limit_reason == "the model's context length"
    prompt = random_prompts([100], seed=5)[0]
    fitted = engine.prepare_request(prompt, SamplingParams(max_tokens=None), None)
    assert fitted.params.max_tokens == 4096 - 100
    (short,) = engine.generate([prompt], GREEDY)
    assert short.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)


def test_the_default_pool_starts_small(tiny_tokenizer):
    """With the default config the pool right after load is ``kv_start_mib`` (256 MiB), a small
    fraction of its cap, for a model whose K/V is as large per token as Qwen3-0.6B's in float32
    (8 KV heads of 128 dims; 4 layers here, not 28)."""
    model = build_model(
        "qwen3", num_hidden_layers=4, num_key_value_heads=8, head_dim=128, num_attention_heads=8
    )
    engine = Engine(model, tiny_tokenizer, EngineConfig(max_model_len=40960))
    stats = engine.stats()
    per_block = engine.runner.store.bytes_per_block
    assert stats.kv_cache_bytes == 256 * 2**20 == stats.kv_blocks_total * per_block
    assert stats.kv_cache_bytes <= stats.kv_blocks_cap * per_block / 8
    assert stats.kv_bytes_used == 0


def test_an_idle_engine_thread_shrinks_the_pool(tiny_tokenizer):
    """``kv_shrink_after_s`` after its last step the engine thread gives the memory back (0 s
    here: at once) and publishes the stats that say so."""
    model = build_model("qwen3")
    config = _elastic(max_num_seqs=4, kv_shrink_after_s=0.0)
    thread = EngineThread(lambda: Engine(model, tiny_tokenizer, config)).start()
    thread.wait_ready(60)
    seen: list[int] = []  # pool sizes in the snapshots outputs arrive with
    done = threading.Semaphore(0)

    def on_output(out) -> None:
        stats = thread.stats()
        seen.append(stats.kv_blocks_total if stats else 0)
        if out.finished:
            done.release()

    try:
        for prompt in random_prompts([30, 25, 40, 35], seed=11):
            thread.submit(prompt, GREEDY, on_output)
        for _ in range(4):
            assert done.acquire(timeout=60)
        assert max(seen) > 4
        deadline = time.monotonic() + 30  # not a timing assert: a bound on waiting for it
        while thread.stats().kv_blocks_total != 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        idle = thread.stats()
        assert (idle.kv_blocks_total, idle.kv_blocks_used) == (4, 0)
        assert (
            idle.kv_cache_bytes
            == 4 * thread.call(lambda e: e.runner.store.bytes_per_block).result()
        )
    finally:
        thread.shutdown()


def test_block_pool_grows_and_compacts_its_cache():
    pool = BlockPool(2)
    a, b = pool.allocate(), pool.allocate()
    pool.grow(4)
    assert pool.num_free == 2 and pool.num_blocks == 4
    c = pool.allocate()
    assert c in (2, 3)
    pool.register(a, b"A")
    pool.register(c, b"C")
    for block in (a, b, c):
        pool.free(block)
    assert pool.num_occupied == 2  # the two cached blocks
    with pytest.raises(RuntimeError, match="in use"):
        pool.share(c) or pool.compact(1)
    pool.free(c)
    kept = pool.compact(1)
    assert kept == [c] and pool.num_blocks == 1  # the most recently freed cached block
    assert pool.lookup(b"C") == 0 and pool.lookup(b"A") is None
    assert pool.num_occupied == 1 and pool.num_free == 1


@pytest.mark.parametrize("speculative", ["off", "ngram"])
def test_a_hybrids_state_slots_at_their_most_are_reserved_with_their_snapshots(
    speculative, tiny_tokenizer, monkeypatch
):
    """The memory the KV pool's cap leaves aside for a hybrid's request state slots is what the
    state store allocates for ``max_num_seqs`` of them at their most: with speculation, each
    slot's rollback snapshot beside it (twice the rows)."""
    seen: list[int] = []

    def capture(model, per_block, context_length, config, reserved=0):
        seen.append(reserved)
        return 64

    monkeypatch.setattr(model_runner, "blocks_for_memory", capture)
    config = _elastic(max_num_seqs=4, enable_prefix_caching=False, speculative=speculative)
    engine = Engine(build_model("qwen3_5"), tiny_tokenizer, config)
    states = engine.runner.states
    assert states is not None
    assert seen == [4 * states.stride * states.bytes_per_slot]
    assert states.stride == (1 if speculative == "off" else 2)
