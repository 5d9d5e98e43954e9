"""The full-attention cache group: every position's K/V, in blocks of a pool shared by all
requests and named by the prefix cache, growing with demand (``elastic.py``).

Every model has one, and the other groups count in its blocks (``group.py``), so the scheduler's
room (``tokens_that_fit``) and rejected drafts' truncation are decided here, and the KV manager
finds a cached prefix by looking it up here first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from macbatch.engine.kv.block_pool import BlockPool
from macbatch.engine.kv.disk.parts import BlockPages, BlockPart
from macbatch.engine.kv.elastic import ElasticPool, PagedMemory
from macbatch.engine.kv.group import CacheSpec, Chunk, StepTables


@dataclass(frozen=True)
class FullAttentionSpec(CacheSpec):
    bytes_per_block: int  # the full-attention layers' pages of one block, scales included


class FullAttentionGroup:
    per_request = False

    def __init__(self, spec: FullAttentionSpec, memory: PagedMemory, block_size: int) -> None:
        self.spec = spec
        self.block_size = block_size
        self.pool = BlockPool(memory.size.start)
        self.elastic = ElasticPool(self.pool, memory.pages, memory.size)
        self._blocks: dict[str, list[int]] = {}

    def block_table(self, request_id: str) -> list[int]:
        return self._blocks.get(request_id, [])

    def has_room(self, request_id: str, num_tokens: int) -> bool:
        """Whether the request's blocks already hold ``num_tokens`` tokens."""
        return len(self._blocks.get(request_id, ())) * self.block_size >= num_tokens

    def tokens_that_fit(self, request_id: str, num_computed: int) -> int:
        """How many more tokens the request could compute with its blocks, all free ones and
        those the pool may still grow by."""
        held = len(self.block_table(request_id))
        return (held + self.pool.num_free + self.elastic.room) * self.block_size - num_computed

    def make_room(self, request_id: str, num_computed: int, num_blocks: int) -> bool:
        missing = num_blocks - len(self.block_table(request_id))
        return missing <= self.pool.num_free or self.elastic.make_room(missing)

    def allocate(self, request_id: str, num_blocks: int) -> None:
        blocks = self._blocks.setdefault(request_id, [])
        blocks.extend(self.pool.allocate() for _ in range(num_blocks - len(blocks)))

    def truncate(self, request_id: str, num_blocks: int) -> None:
        """Give back the request's blocks past its first ``num_blocks``."""
        blocks = self._blocks.get(request_id, [])
        while len(blocks) > num_blocks:
            self.pool.free(blocks.pop())

    def free(self, request_id: str) -> None:
        """The last block first, so a prefix's earlier blocks stay cached longest."""
        for block in reversed(self._blocks.pop(request_id, [])):
            self.pool.free(block)

    def find_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many of the prefix's blocks, from the first, are cached."""
        count = 0
        for digest in hashes:
            if self.pool.lookup(digest) is None:
                break
            count += 1
        return count

    def take_prefix(self, request_id: str, hashes: Sequence[bytes], num_blocks: int) -> None:
        if not num_blocks:
            return
        blocks = []
        for digest in hashes[:num_blocks]:
            block = self.pool.lookup(digest)
            assert block is not None, "found cached, and nothing was taken since"
            self.pool.share(block)
            blocks.append(block)
        self._blocks[request_id] = blocks

    def register(self, request_id: str, hashes: Sequence[bytes], first: int) -> None:
        blocks = self._blocks.get(request_id, [])
        for block, digest in zip(blocks[first:], hashes[first:]):
            self.pool.register(block, digest)

    def add_tables(self, chunks: Sequence[Chunk], tables: StepTables) -> None:
        tables.blocks = [self._blocks.get(c.request.request_id, []) for c in chunks]

    @property
    def bytes_used(self) -> int:
        """Its pages in blocks held by requests or idle in the prefix cache (a draft model's
        pages in the same blocks are the draft's to count: ``core/stats.py``)."""
        return self.pool.num_occupied * self.spec.bytes_per_block

    def shrink(self) -> int:
        return 0 if self._blocks else self.elastic.shrink()

    def disk_part(self) -> BlockPart:
        """Every block of a prefix: the target's pages (``JointPages``: not a draft's)."""
        pages = cast("BlockPages", self.elastic.pages)
        return BlockPart("", self.elastic, pages, lambda n: range(n))
