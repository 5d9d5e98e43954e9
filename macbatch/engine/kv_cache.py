"""The paged KV cache: a pool of fixed-size blocks shared by all requests.

Layout: per layer, one K and one V array stored flat as ``[num_blocks * Hkv * block_size, D]``
and read as ``[num_blocks, Hkv, block_size, D]`` (a free reshape): one KV head's block is
contiguous, which is what the Metal kernel and the reference in ``macbatch.metal`` expect. A token
at position p of a request lives in block ``block_ids[p // block_size]`` at offset
``p % block_size``; its flat row for head h is ``(block * Hkv + h) * block_size + offset``.

Writes are MLX scatters into the flat arrays. The engine replaces each array with the scatter's
result and evaluates all of them in the step's single ``mx.eval``, so nothing else holds the old
buffer and MLX donates it: the pool is updated in place, never copied.

Prefix caching: a full block is named by a hash chained over every token before its end (rooted
in the model's name). Freed blocks keep their hash and stay findable until the pool needs them
back; they are then evicted least recently used first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import numpy as np


class BlockPool:
    """Free list, reference counts and the prefix-hash index of the KV blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.refcounts = np.zeros(num_blocks, dtype=np.int32)
        # Blocks nobody uses, least recently freed first. Uncached blocks go to the front so the
        # cached ones survive as long as possible.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def allocate(self) -> int:
        """A fresh block for exclusive use, evicting the least recently used cached block."""
        if not self._free:
            raise RuntimeError("KV block pool exhausted")
        block, _ = self._free.popitem(last=False)
        digest = self._hash_of.pop(block, None)
        if digest is not None:
            del self._block_of[digest]
        self.refcounts[block] = 1
        return block

    def free(self, block: int) -> None:
        if self.refcounts[block] <= 0:
            raise RuntimeError(f"block {block} freed more often than it was taken")
        self.refcounts[block] -= 1
        if self.refcounts[block] == 0:
            self._free[block] = None
            if block not in self._hash_of:
                self._free.move_to_end(block, last=False)

    def lookup(self, digest: bytes) -> int | None:
        return self._block_of.get(digest)

    def share(self, block: int) -> None:
        """Take one more reference to a cached block (taking it off the free list if idle)."""
        if self.refcounts[block] == 0:
            del self._free[block]
        self.refcounts[block] += 1

    def register(self, block: int, digest: bytes) -> None:
        """Name a full, computed block so later prompts with the same prefix can share it."""
        if block in self._hash_of or digest in self._block_of:
            return
        self._hash_of[block] = digest
        self._block_of[digest] = block


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


@dataclass(frozen=True)
class LayerShape:
    num_kv_heads: int
    head_dim: int


class KVStore:
    """The per-layer page arrays."""

    def __init__(
        self, shapes: list[LayerShape], num_blocks: int, block_size: int, dtype: mx.Dtype
    ) -> None:
        self.shapes = shapes
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.keys = [self._zeros(s, dtype) for s in shapes]
        self.values = [self._zeros(s, dtype) for s in shapes]
        mx.eval(self.keys, self.values)

    def _zeros(self, shape: LayerShape, dtype: mx.Dtype) -> mx.array:
        rows = self.num_blocks * shape.num_kv_heads * self.block_size
        return mx.zeros((rows, shape.head_dim), dtype=dtype)

    @staticmethod
    def bytes_per_block(shapes: list[LayerShape], block_size: int, itemsize: int) -> int:
        return sum(2 * s.num_kv_heads * block_size * s.head_dim * itemsize for s in shapes)

    def write(self, layer: int, rows: mx.array, keys: mx.array, values: mx.array) -> None:
        """Scatter one step's K/V (``[N, Hkv, D]``) into the flat rows computed by the batcher."""
        d = self.shapes[layer].head_dim
        self.keys[layer][rows] = keys.reshape(-1, d).astype(self.keys[layer].dtype)
        self.values[layer][rows] = values.reshape(-1, d).astype(self.values[layer].dtype)

    def pages(self, layer: int) -> tuple[mx.array, mx.array]:
        """``[num_blocks, Hkv, block_size, D]`` views of the layer's K and V."""
        s = self.shapes[layer]
        shape = (self.num_blocks, s.num_kv_heads, self.block_size, s.head_dim)
        return self.keys[layer].reshape(shape), self.values[layer].reshape(shape)

    def arrays(self) -> list[mx.array]:
        return self.keys + self.values
