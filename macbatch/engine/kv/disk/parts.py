"""The cache groups' parts of a cached prefix on disk (``group.DiskPart``): a block group's pages in
one block (full attention's, a sliding window's, a compressed-rows group's row block; a draft
model's pages in the full group's blocks are not kept: ``JointPages`` says why), a recurrent
state's checkpoint (or an open-group state's: ``OpenGroupsPart``), and a checkpoint of held
library caches (``HeldCheckpointPart``: a payload of its own length). Each says which blocks
of a prefix it needs to resume after it, gathers what it holds as bytes to write, and puts bytes
read back into its memory, named in the prefix cache and idle there, so the KV manager then takes
the prefix from RAM as it always does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import mlx.core as mx
import numpy as np

from macbatch.engine.kv.block_pool import BlockPool
from macbatch.engine.kv.checkpoints import StateCheckpoints
from macbatch.engine.kv.elastic import ElasticPool
from macbatch.engine.stores.held_bytes import FORMAT, payload, rebuild
from macbatch.engine.stores.held_caches import HeldCaches
from macbatch.engine.stores.state_store import StateStore


class BlockPages(Protocol):
    """What a block part reads and writes of a group's pages (``KVStore``, ``JointPages``)."""

    def block_slab_bytes(self) -> list[int]: ...

    def gather_blocks(self, blocks: Sequence[int]) -> list[mx.array]: ...

    def scatter_blocks(self, blocks: Sequence[int], slabs: Sequence[np.ndarray]) -> None: ...


class BlockPart:
    """A block group's pages of each block (``tag`` names its files)."""

    gathers_own_buffers = True  # ``gather_blocks`` gathers by index
    sized = True

    def __init__(
        self, tag: str, elastic: ElasticPool, pages: BlockPages, needs: Callable[[int], range]
    ) -> None:
        self.tag = tag
        self.pool: BlockPool = elastic.pool
        self.elastic = elastic
        self.pages = pages
        self.needs = needs

    def slab_bytes(self) -> list[int]:
        return self.pages.block_slab_bytes()

    def lookup(self, digest: bytes) -> int | None:
        return self.pool.lookup(digest)

    def gather(self, places: Sequence[int]) -> list[mx.array]:
        return self.pages.gather_blocks(places)

    def restore(
        self, digests: Sequence[bytes], slabs: Sequence[np.ndarray], keep: Sequence[bytes]
    ) -> int:
        """Fresh blocks (growing the pool if it must) while ``keep``'s blocks are held, so no
        allocation evicts them; then named and given back, idle in the prefix cache."""
        pool = self.pool
        held = [b for b in map(pool.lookup, keep) if b is not None]
        for block in held:
            pool.share(block)
        count = len(digests)
        if not self.elastic.make_room(count):
            count = pool.num_free
        # in order, so the blocks that are free side by side are written as one run
        blocks = sorted(pool.allocate() for _ in range(count))
        if blocks:
            self.pages.scatter_blocks(blocks, [s[:count] for s in slabs])
        for block, digest in zip(blocks, digests):
            pool.register(block, digest)
        for block in [*held, *reversed(blocks)]:
            pool.free(block)
        return count


class CheckpointPart:
    """A recurrent state's checkpoints: the state after block i, named by digest i."""

    tag = "state"
    gathers_own_buffers = False  # one row is a slice of the store's array
    sized = True

    def __init__(self, checkpoints: StateCheckpoints, store: StateStore) -> None:
        self.checkpoints = checkpoints
        self.store = store

    def slab_bytes(self) -> list[int]:
        return self.store.slab_bytes()

    def needs(self, num_blocks: int) -> range:
        return range(num_blocks - 1, num_blocks) if num_blocks else range(0)

    def lookup(self, digest: bytes) -> int | None:
        return self.checkpoints.peek(digest)

    def gather(self, places: Sequence[int]) -> list[mx.array]:
        return self.store.gather_rows(places)

    def restore(
        self, digests: Sequence[bytes], slabs: Sequence[np.ndarray], keep: Sequence[bytes]
    ) -> int:
        kept = set(keep)
        for i, digest in enumerate(digests):
            row = self.checkpoints.restore(digest, kept)
            if row < 0:
                return i
            self.store.scatter_row(row, [s[i] for s in slabs])
            kept.add(digest)
        return len(digests)


class OpenGroupsPart(CheckpointPart):
    """DeepSeek V4's open-group state's checkpoints (``kv/open_groups.py``): a recurrent
    state's, under a tag of their own."""

    tag = "open"


class HeldCheckpointPart(CheckpointPart):
    """Held library caches' checkpoints (``HeldCaches``: DeepSeek V4): each one's cache objects
    as one payload of its own length (``stores/held_bytes.py``; the compressed rows grow with
    the context), rebuilt into new caches of the family's kind when read."""

    tag = FORMAT  # the payload's format names the files: another never reads them
    gathers_own_buffers = True  # each payload is a concatenation of its own
    sized = False

    def __init__(self, checkpoints: StateCheckpoints, store: HeldCaches) -> None:
        super().__init__(checkpoints, store)
        self.held = store

    def slab_bytes(self) -> list[int]:
        return []  # not sized: a payload is as long as its file

    def lookup(self, digest: bytes) -> int | None:
        """Its row, when every layer's caches are in it (a step fills a checkpoint's layers as
        it builds them)."""
        row = self.checkpoints.peek(digest)
        caches = None if row is None else self.held.held.get(row)
        return row if caches is not None and all(c is not None for c in caches) else None

    def gather(self, places: Sequence[int]) -> list[mx.array]:
        """One payload per checkpoint row (``[bytes]`` uint8, lazy)."""
        return [payload(self.held.held[row]) for row in places]

    def restore(
        self, digests: Sequence[bytes], slabs: Sequence[np.ndarray], keep: Sequence[bytes]
    ) -> int:
        """``slabs[i]``: digest i's payload, rebuilt into new caches held in a checkpoint row
        named ``digests[i]``; stops at one that is not these caches' payload."""
        assert self.held.new_caches is not None, "the runner gives held caches their kind"
        kept = set(keep)
        for i, (digest, data) in enumerate(zip(digests, slabs, strict=True)):
            caches = rebuild(data, self.held.new_caches())
            row = -1 if caches is None else self.checkpoints.restore(digest, kept)
            if caches is None or row < 0:
                return i
            self.held.hold(row, caches)
            kept.add(digest)
        return len(digests)
