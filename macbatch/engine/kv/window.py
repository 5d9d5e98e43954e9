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
next turn of a conversation; ``take_prefix`` says how far that is, and the KV manager shares no
further in either group.
"""

from __future__ import annotations

from macbatch.engine.kv.block_pool import BlockPool
from macbatch.engine.kv.elastic import ElasticPool

DUMMY_BLOCK = 0  # a freed entry's id: before every window (masked if read), never written


class WindowBlocks:
    def __init__(
        self, pool: BlockPool, block_size: int, window: int, elastic: ElasticPool | None
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.window = window
        self.elastic = elastic
        self._tables: dict[str, list[int]] = {}
        self._start: dict[str, int] = {}  # how many leading entries are given back

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def first_needed(self, num_computed: int) -> int:
        """The first block any window still needs once ``num_computed`` tokens are computed: that
        of the next token's window, and of the window before the last block boundary (where a
        later request resuming this prefix would start)."""
        boundary = num_computed // self.block_size * self.block_size
        return max(0, boundary - self.window) // self.block_size

    def allocate(self, request_id: str, num_computed: int, num_blocks: int) -> bool:
        """Give back the blocks that left the window, then extend the table to ``num_blocks``
        entries (growing an elastic pool first); False (nothing taken) when there is no room."""
        table = self._tables.setdefault(request_id, [])
        self._release_behind(request_id, table, self.first_needed(num_computed))
        missing = num_blocks - len(table)
        if missing <= 0:
            return True
        if missing > self.pool.num_free and not (
            self.elastic is not None and self.elastic.make_room(missing)
        ):
            if not table:
                del self._tables[request_id]
                self._start.pop(request_id, None)
            return False
        table.extend(self.pool.allocate() for _ in range(missing))
        return True

    def _release_behind(self, request_id: str, table: list[int], first: int) -> None:
        start = self._start.get(request_id, 0)
        if first <= start:
            return
        for i in range(start, min(first, len(table))):
            self.pool.free(table[i])  # idle in the prefix cache: reused first, never held
            table[i] = DUMMY_BLOCK
        self._start[request_id] = first

    def take_prefix(self, request_id: str, hashes: list[bytes]) -> int:
        """Of the cached prefix ``hashes`` (the full group's), the most leading blocks this group
        can resume after (its window before that point is cached); shares those blocks and
        returns the count."""
        for count in range(len(hashes), 0, -1):
            first = self.first_needed(count * self.block_size)
            found = [self.pool.lookup(digest) for digest in hashes[first:count]]
            blocks = [block for block in found if block is not None]
            if len(blocks) == len(found):
                for block in blocks:
                    self.pool.share(block)
                self._tables[request_id] = [DUMMY_BLOCK] * first + blocks
                self._start[request_id] = first
                return count
        return 0

    def register(self, request_id: str, first: int, digests: list[bytes]) -> None:
        """Name the request's blocks ``first``.. (those it still holds) as the full group names
        its own."""
        table = self._tables.get(request_id, [])
        start = self._start.get(request_id, 0)
        for i, digest in enumerate(digests, first):
            if start <= i < len(table):
                self.pool.register(table[i], digest)

    def free(self, request_id: str) -> None:
        """Return every block the request holds (the last first), keeping their names."""
        table = self._tables.pop(request_id, [])
        start = self._start.pop(request_id, 0)
        for block in reversed(table[start:]):
            self.pool.free(block)

    def shrink(self) -> int:
        if self.elastic is None or self._tables:
            return 0
        return self.elastic.shrink()
