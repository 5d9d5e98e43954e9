"""The paged KV cache: in-place writes, block accounting."""

from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.block_pool import BlockPool
from tests.support.tiny import build_model


@pytest.mark.parametrize("kv_bits", [None, 4])
def test_steps_do_not_copy_the_pool(tiny_tokenizer, kv_bits):
    """Active memory stays flat across many decode steps, and the peak never holds a second
    copy of the pool (which a copying scatter would need), float or quantized pages (whose
    codes and scales are written in place the same way, never dequantized as a whole)."""
    model = build_model("qwen3", num_hidden_layers=4)
    config = EngineConfig(num_blocks=2048, block_size=16, kv_bits=kv_bits)
    engine = Engine(model, tiny_tokenizer, config)
    pool_bytes = engine.stats().kv_cache_bytes
    assert pool_bytes >= (16 if kv_bits is None else 4) * 2**20
    for i in range(4):
        engine.add_request([3 + i] * 40, SamplingParams(max_tokens=60, ignore_eos=True))
    for _ in range(5):
        engine.step()
    gc.collect()  # an earlier test's engine, freed mid-measure, would read as a change
    mx.clear_cache()
    baseline = mx.get_active_memory()
    mx.reset_peak_memory()
    for _ in range(40):
        engine.step()
    assert abs(mx.get_active_memory() - baseline) < 0.05 * pool_bytes
    # One copied page array would be pool_bytes / 8 (4 layers, K and V).
    assert mx.get_peak_memory() - baseline < pool_bytes / 32


def test_pool_refcounts_and_lru_eviction():
    pool = BlockPool(3)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate()
    pool.register(a, b"A")
    pool.share(a)
    pool.free(a)
    pool.free(a)
    pool.free(b)
    assert pool.lookup(b"A") == a  # cached while idle
    assert pool.allocate() == b  # uncached blocks are reused before cached ones
    assert pool.allocate() == a and pool.lookup(b"A") is None  # then the cached one is evicted
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free(c) or pool.free(c)


def test_pool_sized_from_memory_fraction(tiny_tokenizer):
    model = build_model("qwen3")
    small = Engine(model, tiny_tokenizer, EngineConfig(memory_fraction=0.01, max_num_seqs=4))
    # The cap: what max_num_seqs full-length sequences can use (the pool starts at most there).
    assert small.info.kv_blocks_cap == 4 * (4096 // 16)
    assert small.kv.pool.num_blocks <= small.info.kv_blocks_cap
    assert np.all(small.kv.pool.refcounts == 0)
