"""The KV manager's block bookkeeping, without a model: allocation, prefix sharing, freeing."""

from __future__ import annotations

import numpy as np

from macbatch.engine.kv.manager import KVManager
from tests.support.fake_requests import make_request
from tests.support.kv import fixed_kv_manager

BLOCK = 4


def _manager(num_blocks: int, caching: bool = True) -> KVManager:
    return fixed_kv_manager(num_blocks, BLOCK, b"root" if caching else None)


def test_allocate_slots_takes_whole_blocks_or_nothing():
    kv = _manager(5)
    assert kv.allocate_slots("a", 0, 9)  # 9 tokens: 3 blocks
    assert len(kv.block_table("a")) == 3 and kv.num_free_blocks == 2
    assert kv.allocate_slots("a", 9, 3)  # positions 9..11 fit in the third block
    assert len(kv.block_table("a")) == 3
    assert not kv.allocate_slots("b", 0, 13)  # needs 4 blocks, 2 are free
    assert kv.block_table("b") == [] and kv.num_free_blocks == 2
    assert kv.tokens_that_fit("a", 12) == 2 * BLOCK  # its full blocks, plus the free ones
    kv.free("a")
    assert kv.num_free_blocks == 5 and kv.block_table("a") == []


def test_a_cached_prefix_is_shared_by_block_and_keeps_a_token_to_compute():
    kv = _manager(8)
    first = make_request(list(range(100, 112)))  # 3 full blocks
    assert kv.allocate_slots(first.request_id, 0, 12)
    kv.cache_full_blocks(first, 12)
    same = make_request(list(range(100, 112)))
    # 12 tokens match, but the last block is left to compute: the request needs logits.
    assert kv.take_cached_prefix(same, same.num_tokens) == 2 * BLOCK
    assert kv.block_table(same.request_id) == kv.block_table(first.request_id)[:2]
    diverging = make_request(list(range(100, 104)) + [7] * 8)
    assert kv.take_cached_prefix(diverging, diverging.num_tokens) == BLOCK
    refs = kv.pool.refcounts[kv.block_table(first.request_id)]
    np.testing.assert_array_equal(refs, [3, 2, 1])


def test_freed_cached_blocks_stay_findable_until_the_pool_needs_them():
    kv = _manager(3)
    first = make_request(list(range(8)))
    kv.allocate_slots(first.request_id, 0, 8)
    kv.cache_full_blocks(first, 6)  # only the first block is full
    kv.free(first.request_id)
    again = make_request(list(range(8)) + [9])
    assert kv.take_cached_prefix(again, again.num_tokens) == BLOCK
    kv.free(again.request_id)
    assert kv.allocate_slots("other", 0, 3 * BLOCK)  # takes every block, evicting the cache
    late = make_request(list(range(8)) + [9])
    assert kv.take_cached_prefix(late, late.num_tokens) == 0


def test_without_prefix_caching_nothing_is_shared():
    kv = _manager(4, caching=False)
    first = make_request(list(range(8)))
    kv.allocate_slots(first.request_id, 0, 8)
    kv.cache_full_blocks(first, 8)
    assert kv.take_cached_prefix(make_request(list(range(9))), 9) == 0
    assert kv.pool.num_cached == 0
