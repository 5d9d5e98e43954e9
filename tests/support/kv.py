"""KV managers without a model, for model-free tests of the scheduler, the KV manager and its
cache groups: a fixed pool's host bookkeeping, with no pages behind it."""

from __future__ import annotations

from collections.abc import Sequence

from macbatch.engine.kv.elastic import PagedMemory, PoolSize
from macbatch.engine.kv.full import FullAttentionSpec
from macbatch.engine.kv.group import CacheSpec
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.kv.registry import kv_manager


class NoPages:
    """A fixed pool's pages: never resized."""

    def resize(self, num_blocks: int, keep: Sequence[int] | None = None) -> None:
        raise AssertionError("a fixed pool resized its pages")


def fixed_pool(num_blocks: int) -> PagedMemory:
    return PagedMemory(NoPages(), PoolSize(num_blocks, num_blocks))


def fixed_kv_manager(
    num_blocks: int,
    block_size: int,
    prefix_root: bytes | None,
    others: Sequence[tuple[CacheSpec, object]] = (),
) -> KVManager:
    """A manager over a full-attention group of ``num_blocks`` blocks and ``others`` (each a
    spec and its memory), built by the registry as the engine builds its own."""
    full = (FullAttentionSpec(bytes_per_block=0), fixed_pool(num_blocks))
    return kv_manager([full, *others], block_size, prefix_root)
