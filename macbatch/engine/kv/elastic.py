"""The elastic KV pool: it starts small, grows in segments as requests need blocks, up to its cap,
and gives memory back when the engine has been idle.

A pool sized once at start took what the longest load could use (half the machine by default:
12.7 GB resident for a 0.6B model's one short chat on a 24 GB machine). Now the cap is what that
sizing computes, and the pool holds what the work needs: ``kv_start_mib`` of pages at load, and
twice the size (or what a request is short, if more) each time the KV manager finds too few free
blocks, before the scheduler preempts anyone. Growing copies the pages into longer arrays (block
ids keep their rows, so block tables and a step in flight stay valid); shrinking, when nothing
holds a block, compacts the most recently used prefix-cache blocks into the start size and drops
the rest. ``EngineConfig.num_blocks`` (and a distributed group, whose ranks must agree on every
block id) pins the size: start and cap are equal, and nothing here ever resizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from macbatch.engine.config import EngineConfig
from macbatch.engine.kv.block_pool import BlockPool

# Each growth at least doubles the pool: a pool grown from the start to n blocks copied fewer
# than n blocks in all, in log2(n / start) copies.
GROWTH_FACTOR = 2


@dataclass(frozen=True)
class PoolSize:
    """How many blocks the pool starts with and may grow to (equal: a fixed pool)."""

    start: int
    cap: int

    @property
    def elastic(self) -> bool:
        return self.start < self.cap

    def grown(self, current: int, needed: int) -> int:
        """The size a pool of ``current`` blocks grows to when it needs ``needed``."""
        return min(self.cap, max(current * GROWTH_FACTOR, needed))


def pool_size(cap: int, bytes_per_block: int, config: EngineConfig, fixed: bool) -> PoolSize:
    """``fixed``: the pool keeps ``cap`` blocks from the start. Otherwise it starts with
    ``config.kv_start_mib`` of blocks, and at least one per sequence that may run at once."""
    if fixed or not bytes_per_block:  # blocks of no pages (a recurrent-only model) cost nothing
        return PoolSize(cap, cap)
    start = int(config.kv_start_mib * 2**20) // bytes_per_block
    return PoolSize(min(cap, max(config.max_num_seqs, start)), cap)


class Pages(Protocol):
    """The page arrays behind the block ids (``KVStore``)."""

    def resize(self, num_blocks: int, keep: Sequence[int] | None = None) -> None: ...


@dataclass(frozen=True)
class PagedMemory:
    """What the model runner gives a block group: the pages behind its block ids and how many
    blocks they start with and may grow to."""

    pages: Pages
    size: PoolSize


class ElasticPool:
    """Grows and shrinks the block ids (``BlockPool``) and their pages together."""

    def __init__(self, pool: BlockPool, pages: Pages, size: PoolSize) -> None:
        self.pool = pool
        self.pages = pages
        self.size = size

    @property
    def room(self) -> int:
        """How many blocks the pool may still grow by."""
        return self.size.cap - self.pool.num_blocks

    def make_room(self, blocks: int) -> bool:
        """Grow until ``blocks`` blocks are free, or as far as the cap allows; whether they are."""
        short = blocks - self.pool.num_free
        if short > 0 and self.room > 0:
            size = self.size.grown(self.pool.num_blocks, self.pool.num_blocks + short)
            self.pages.resize(size)
            self.pool.grow(size)
        return self.pool.num_free >= blocks

    def shrink(self) -> int:
        """Back to the start size, keeping the most recently used prefix-cache blocks that fit
        (compacted to the lowest ids); only when no request holds a block. Returns how many
        blocks the pool gave back."""
        before = self.pool.num_blocks
        if before <= self.size.start or self.pool.num_free < before:
            return 0
        kept = self.pool.compact(self.size.start)
        self.pages.resize(self.size.start, kept)
        return before - self.size.start
