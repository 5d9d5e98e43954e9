"""The host side of the paged KV cache: a pool of fixed-size block ids shared by all requests,
and the hash chain that names full blocks for the prefix cache.

Prefix caching: a full block is named by a hash chained over every token before its end (rooted
in the model's name). Freed blocks keep their hash and stay findable until the pool needs them
back; they are then evicted least recently used first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np


class BlockPool:
    """Free list, reference counts and the prefix-hash index of the KV blocks."""

    def __init__(self, num_blocks: int) -> None:
        self._reset(num_blocks)

    def _reset(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.refcounts = np.zeros(num_blocks, dtype=np.int32)
        # Blocks nobody uses, least recently freed first. Uncached blocks go to the front so the
        # cached ones survive as long as possible.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._free_cached = 0  # free blocks that still hold a cached prefix

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    @property
    def num_occupied(self) -> int:
        """Blocks whose pages hold something: taken by a request, or idle in the prefix cache."""
        return self.num_blocks - self.num_free + self._free_cached

    def allocate(self) -> int:
        """A fresh block for exclusive use, evicting the least recently used cached block."""
        if not self._free:
            raise RuntimeError("KV block pool exhausted")
        block, _ = self._free.popitem(last=False)
        digest = self._hash_of.pop(block, None)
        if digest is not None:
            del self._block_of[digest]
            self._free_cached -= 1
        self.refcounts[block] = 1
        return block

    def free(self, block: int, keep_cached: bool = True) -> None:
        """Drop one reference; a block nobody holds any more goes back to the free list, still
        findable in the prefix cache unless ``keep_cached`` is False (then it loses its name)."""
        if self.refcounts[block] <= 0:
            raise RuntimeError(f"block {block} freed more often than it was taken")
        self.refcounts[block] -= 1
        if self.refcounts[block] == 0:
            if not keep_cached and block in self._hash_of:
                del self._block_of[self._hash_of.pop(block)]
            self._free[block] = None
            if block in self._hash_of:
                self._free_cached += 1
            else:
                self._free.move_to_end(block, last=False)

    def lookup(self, digest: bytes) -> int | None:
        return self._block_of.get(digest)

    def share(self, block: int) -> None:
        """Take one more reference to a cached block (taking it off the free list if idle)."""
        if self.refcounts[block] == 0:
            del self._free[block]
            if block in self._hash_of:
                self._free_cached -= 1
        self.refcounts[block] += 1

    def register(self, block: int, digest: bytes) -> None:
        """Name a full, computed block so later prompts with the same prefix can share it."""
        if block in self._hash_of or digest in self._block_of:
            return
        self._hash_of[block] = digest
        self._block_of[digest] = block
        if self.refcounts[block] == 0:  # named while idle
            self._free_cached += 1

    def grow(self, num_blocks: int) -> None:
        """Add ids up to ``num_blocks`` (their pages were added first), free and uncached: they
        are taken before any cached block is evicted."""
        new = range(self.num_blocks, num_blocks)
        self.refcounts = np.concatenate([self.refcounts, np.zeros(len(new), dtype=np.int32)])
        for block in reversed(new):
            self._free[block] = None
            self._free.move_to_end(block, last=False)
        self.num_blocks = num_blocks

    def compact(self, num_blocks: int) -> list[int]:
        """Become a pool of ``num_blocks`` that keeps the most recently freed cached blocks that
        fit, renumbered from 0; returns their old ids in their new order. Only when no block is
        taken: block ids change."""
        if self.num_free < self.num_blocks:
            raise RuntimeError("cannot compact a pool whose blocks are in use")
        recent = [b for b in reversed(self._free) if b in self._hash_of][:num_blocks]
        kept = recent[::-1]  # least recently freed first, as the free list keeps them
        digests = [self._hash_of[b] for b in kept]
        self._reset(num_blocks)
        for block in range(len(kept)):  # uncached first, then the cache in its LRU order
            self._free.move_to_end(block)
        for block, digest in enumerate(digests):
            self.register(block, digest)
        return kept


def chain_block_hashes(previous: bytes, block_tokens: list[int], block_size: int) -> list[bytes]:
    """Hashes of consecutive full blocks whose tokens are ``block_tokens``, chained from
    ``previous`` (the hash of the block before the first, or the root): each block's hash covers
    every token before its end."""
    hashes: list[bytes] = []
    ids = np.asarray(block_tokens, dtype=np.int64)
    for i in range(len(block_tokens) // block_size):
        digest = hashlib.blake2b(previous, digest_size=16)
        digest.update(ids[i * block_size : (i + 1) * block_size].tobytes())
        previous = digest.digest()
        hashes.append(previous)
    return hashes
