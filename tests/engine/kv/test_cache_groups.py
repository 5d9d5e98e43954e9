"""A new cache kind is one module and one registry entry: a group defined here (a spec and a class
following ``CacheGroup``), registered for the test, is coordinated by the KV manager beside the
full-attention group with no change to the manager: allocation is all-or-nothing across the
groups, freeing frees it, a cached prefix is narrowed by it, and it names its blocks under the
prefix cache's chain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from macbatch.engine.kv.block_pool import chain_block_hashes
from macbatch.engine.kv.group import CacheSpec, Chunk, StepTables
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.kv.registry import CACHE_GROUPS
from tests.support.fake_requests import make_request
from tests.support.kv import fixed_kv_manager

BLOCK = 4
ROOT = b"root"


@dataclass(frozen=True)
class CountedSpec(CacheSpec):
    capacity: int  # blocks it holds for all requests together
    resume_every: int  # it resumes a cached prefix only after a multiple of this many blocks
    bytes_per_block: int = 10


class CountedGroup:
    """Holds a count of blocks per request, up to its capacity, and records what it is told."""

    per_request = False

    def __init__(self, spec: CountedSpec, memory: object, block_size: int) -> None:
        self.spec = spec
        self.held: dict[str, int] = {}
        self.named: dict[str, list[bytes]] = {}
        self.resumed: dict[str, int] = {}

    def make_room(self, request_id: str, num_computed: int, num_blocks: int) -> bool:
        others = sum(self.held.values()) - self.held.get(request_id, 0)
        return others + num_blocks <= self.spec.capacity

    def allocate(self, request_id: str, num_blocks: int) -> None:
        self.held[request_id] = max(num_blocks, self.held.get(request_id, 0))

    def free(self, request_id: str) -> None:
        self.held.pop(request_id, None)

    def find_prefix(self, hashes: Sequence[bytes]) -> int:
        return len(hashes) // self.spec.resume_every * self.spec.resume_every

    def take_prefix(self, request_id: str, hashes: Sequence[bytes], num_blocks: int) -> None:
        if num_blocks:
            self.held[request_id] = self.resumed[request_id] = num_blocks

    def register(self, request_id: str, hashes: Sequence[bytes], first: int) -> None:
        self.named.setdefault(request_id, []).extend(hashes[first:])

    def add_tables(self, chunks: Sequence[Chunk], tables: StepTables) -> None:
        pass  # a real kind's tables go to the packer; this one has no pages

    @property
    def bytes_used(self) -> int:
        return sum(self.held.values()) * self.spec.bytes_per_block

    def shrink(self) -> int:
        return 0

    def disk_part(self) -> None:
        return None  # keeps nothing on disk: the tier is off for a model with this kind


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(CACHE_GROUPS, CountedSpec, CountedGroup)


def _manager(num_blocks: int, *specs: CountedSpec) -> tuple[KVManager, list[CountedGroup]]:
    kv = fixed_kv_manager(num_blocks, BLOCK, ROOT, [(spec, None) for spec in specs])
    groups = [g for g in kv.groups if isinstance(g, CountedGroup)]
    assert len(groups) == len(specs)
    return kv, groups


def test_a_kind_without_a_registry_entry_cannot_be_built():
    with pytest.raises(KeyError):
        _manager(8, CountedSpec(capacity=8, resume_every=1))


def test_allocation_is_all_or_nothing_across_groups_and_free_frees_every_group(registered):
    kv, [counted] = _manager(8, CountedSpec(capacity=3, resume_every=1))
    assert kv.allocate_slots("a", 0, 3 * BLOCK)
    assert len(kv.block_table("a")) == 3 and counted.held == {"a": 3}
    assert kv.bytes_used == 3 * 10  # summed over the groups (the full group's pages: 0 bytes)

    # the full group has room for "b", the counted group has not: neither takes any
    assert not kv.allocate_slots("b", 0, BLOCK)
    assert kv.block_table("b") == [] and kv.num_free_blocks == 5 and "b" not in counted.held
    # the full group has no room for "c": the counted group is not given any either
    assert not kv.allocate_slots("c", 0, 6 * BLOCK)
    assert kv.num_free_blocks == 5 and "c" not in counted.held

    # "a"'s 4th block: the full group has room, the counted group is full
    assert not kv.allocate_slots("a", 3 * BLOCK, 1)
    assert len(kv.block_table("a")) == 3 and counted.held == {"a": 3}

    kv.free("a")
    assert counted.held == {} and kv.num_free_blocks == 8
    assert kv.allocate_slots("b", 0, BLOCK) and counted.held == {"b": 1}


def test_blocks_are_named_under_the_chain_and_a_prefix_is_narrowed_by_every_group(registered):
    """Group A resumes after an even number of blocks, B after a multiple of 3: of 4 cached
    blocks A alone allows 4, B alone 3, together only 0 (a single pass would stop at 3)."""
    tokens = list(range(100, 117))  # 4 full blocks and one token
    kv, [evens] = _manager(16, CountedSpec(capacity=16, resume_every=2))
    first = make_request(tokens)
    assert kv.allocate_slots(first.request_id, 0, len(tokens))
    kv.cache_full_blocks(first, 8)
    kv.cache_full_blocks(first, 16)  # named in two calls: each digest once, in chain order
    chain = chain_block_hashes(ROOT, tokens[:16], BLOCK)
    assert evens.named[first.request_id] == chain
    assert [kv.pool.lookup(d) for d in chain] == kv.block_table(first.request_id)[:4]
    kv.free(first.request_id)

    same = make_request(tokens[:15])  # 3 blocks usable (a token is left to compute)
    assert kv.take_cached_prefix(same, same.num_tokens) == 2 * BLOCK
    assert kv.block_table(same.request_id) == [kv.pool.lookup(d) for d in chain[:2]]
    assert evens.resumed[same.request_id] == 2 and evens.held[same.request_id] == 2

    both, [a, b] = _manager(16, *(CountedSpec(16, resume_every=n) for n in (2, 3)))
    first = make_request(tokens)
    assert both.allocate_slots(first.request_id, 0, len(tokens))
    both.cache_full_blocks(first, 16)
    both.free(first.request_id)
    again = make_request(tokens)
    assert both.take_cached_prefix(again, again.num_tokens) == 0
    assert both.block_table(again.request_id) == [] and not a.resumed and not b.resumed
