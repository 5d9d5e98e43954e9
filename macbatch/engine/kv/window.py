"""The window cache group: block tables for a model's sliding-window layers, holding only the
blocks some window of the request can still see.

Gemma 3, Gemma 4 and gpt-oss attend over the last ``window`` tokens in most layers. Those layers'
pages live in a pool of their own (its own block ids), and each request's table here is indexed
by position like the full group's (``table[p // block_size]``), but a block whose every position
lies before the window of the request's next token to compute is given back, and its entry
becomes block 0: no attention backend lets a key before a row's window into its softmax (the
Metal and CPU kernels never load a block wholly before it; the reference masks what it
gathers). What a request holds is its window, rounded out to blocks, plus the chunk it computes:
about ``window + chunk`` tokens, whatever its length.

Prefix cache: blocks are named under the full group's hash chain, and a block given back because
it left the window keeps its name: it is idle in the cache, the first to be reused when blocks
run short (least recently used first), never held. So the window group resumes a cached prefix
wherever the window before the resume point is still cached: a job's shared system prompt, the
next turn of a conversation; ``find_prefix`` says how far that is, and the KV manager shares no
further in any group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from macbatch.engine.kv.block_pool import BlockPool
from macbatch.engine.kv.disk.parts import BlockPages, BlockPart
from macbatch.engine.kv.elastic import ElasticPool, PagedMemory
from macbatch.engine.kv.group import CacheSpec, Chunk, StepTables

DUMMY_BLOCK = 0  # a freed entry's id: before every window (masked if read), never written


@dataclass(frozen=True)
class SlidingWindowSpec(CacheSpec):
    bytes_per_block: int  # the sliding-window layers' pages of one block, scales included
    window: int  # the tokens they attend over (the largest of their windows)


class SlidingWindowGroup:
    per_request = False

    def __init__(self, spec: SlidingWindowSpec, memory: PagedMemory, block_size: int) -> None:
        self.spec = spec
        self.block_size = block_size
        self.window = spec.window
        self.pool = BlockPool(memory.size.start)
        self.elastic = ElasticPool(self.pool, memory.pages, memory.size)
        self._tables: dict[str, list[int]] = {}
        self._start: dict[str, int] = {}  # how many leading entries are given back

    def block_table(self, request_id: str) -> list[int]:
        """The request's table (block 0 where a block left the window)."""
        return self._tables.get(request_id, [])

    def first_needed(self, num_computed: int) -> int:
        """The first block any window still needs once ``num_computed`` tokens are computed: that
        of the next token's window, and of the window before the last block boundary (where a
        later request resuming this prefix would start)."""
        boundary = num_computed // self.block_size * self.block_size
        return max(0, boundary - self.window) // self.block_size

    def make_room(self, request_id: str, num_computed: int, num_blocks: int) -> bool:
        """Give back the blocks that left the window first."""
        table = self._tables.get(request_id, [])
        if table:
            self._release_behind(request_id, table, self.first_needed(num_computed))
        missing = num_blocks - len(table)
        return missing <= self.pool.num_free or self.elastic.make_room(missing)

    def allocate(self, request_id: str, num_blocks: int) -> None:
        table = self._tables.setdefault(request_id, [])
        table.extend(self.pool.allocate() for _ in range(num_blocks - len(table)))

    def _release_behind(self, request_id: str, table: list[int], first: int) -> None:
        start = self._start.get(request_id, 0)
        if first <= start:
            return
        for i in range(start, min(first, len(table))):
            self.pool.free(table[i])  # idle in the prefix cache: reused first, never held
            table[i] = DUMMY_BLOCK
        self._start[request_id] = first

    def find_prefix(self, hashes: Sequence[bytes]) -> int:
        """Of the cached prefix ``hashes``, the most leading blocks whose window before that
        point is cached."""
        for count in range(len(hashes), 0, -1):
            first = self.first_needed(count * self.block_size)
            if all(self.pool.lookup(digest) is not None for digest in hashes[first:count]):
                return count
        return 0

    def take_prefix(self, request_id: str, hashes: Sequence[bytes], num_blocks: int) -> None:
        """Share the window before block ``num_blocks``; the entries before it are block 0."""
        if not num_blocks:
            return
        first = self.first_needed(num_blocks * self.block_size)
        blocks = []
        for digest in hashes[first:num_blocks]:
            block = self.pool.lookup(digest)
            assert block is not None, "found cached, and nothing was taken since"
            self.pool.share(block)
            blocks.append(block)
        self._tables[request_id] = [DUMMY_BLOCK] * first + blocks
        self._start[request_id] = first

    def register(self, request_id: str, hashes: Sequence[bytes], first: int) -> None:
        """Name the new blocks the request still holds as the full group names its own."""
        table = self._tables.get(request_id, [])
        start = self._start.get(request_id, 0)
        for i in range(max(first, start), min(len(hashes), len(table))):
            self.pool.register(table[i], hashes[i])

    def add_tables(self, chunks: Sequence[Chunk], tables: StepTables) -> None:
        tables.window = [self._tables.get(c.request.request_id, []) for c in chunks]

    def free(self, request_id: str) -> None:
        """Return every block the request holds (the last first), keeping their names."""
        table = self._tables.pop(request_id, [])
        start = self._start.pop(request_id, 0)
        for block in reversed(table[start:]):
            self.pool.free(block)

    @property
    def bytes_used(self) -> int:
        return self.pool.num_occupied * self.spec.bytes_per_block

    def shrink(self) -> int:
        return 0 if self._tables else self.elastic.shrink()

    def disk_part(self) -> BlockPart:
        """The window's blocks before a resume point: its layers' pages."""
        pages = cast("BlockPages", self.elastic.pages)
        return BlockPart("window", self.elastic, pages, self._window_before)

    def _window_before(self, num_blocks: int) -> range:
        return range(self.first_needed(num_blocks * self.block_size), num_blocks)
