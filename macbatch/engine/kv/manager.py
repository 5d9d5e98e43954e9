"""The one owner of every request's cache: it coordinates the model's cache groups (``group.py``:
full attention's blocks, a sliding window's, a recurrent state's slot), so the scheduler asks one
manager for room in all of them and freeing a request frees all of them. It also owns the prefix
cache's chain of block digests, which names block i of every group.

The scheduler decides who runs (policy); this module does the block arithmetic it asks for. A
request's token at position p lives in ``block_table(rid)[p // block_size]`` at offset
``p % block_size``. Requests are read (ids and tokens), never changed: how many tokens are
computed is the scheduler's to track.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from macbatch.arithmetic import ceil_div
from macbatch.engine.kv.block_pool import chain_block_hashes
from macbatch.engine.kv.full import FullAttentionGroup
from macbatch.engine.kv.group import CacheGroup, Chunk, StepTables

if TYPE_CHECKING:
    from macbatch.engine.kv.disk.tier import DiskTier

G = TypeVar("G")


class HasTokens(Protocol):
    """What the KV manager reads of a request."""

    request_id: str
    cache_scope: bytes  # what its chain starts from beside the root (an adapter's blocks)

    @property
    def num_prompt_tokens(self) -> int: ...

    def hash_slice(self, start: int, stop: int) -> list[int]: ...

    def can_resume_at(self, position: int) -> bool: ...


class KVManager:
    def __init__(
        self,
        groups: Sequence[CacheGroup],
        block_size: int,
        prefix_root: bytes | None,
        disk: DiskTier | None = None,
    ) -> None:
        """``groups``: the full-attention group first (its blocks are the ones every group counts
        in), then the model's other groups; ``prefix_root``: the root of the prefix cache's
        chain (None: prefix caching off); ``disk``: the disk tier below the prefix cache
        (``kv/disk/``), keeping every group's part of a prefix."""
        full = groups[0]
        assert isinstance(full, FullAttentionGroup), "the full-attention group comes first"
        self.groups = tuple(groups)
        self.full = full
        self.pool = full.pool
        self.block_size = block_size
        self.prefix_root = prefix_root
        self._others = self.groups[1:]
        # asked on every allocation, even when the full group's blocks already have room
        self._asked_each_step = tuple(g for g in self._others if not g.per_request)
        self._hashes: dict[str, list[bytes]] = {}  # of the request's first cached blocks
        self.disk = disk if prefix_root is not None else None
        self._from_disk: dict[str, int] = {}  # tokens of a request's prefix read from disk
        # a waiting request's chain, hashed for the disk tier when it was queued: (tokens, chain)
        self._queued_chains: dict[str, tuple[int, list[bytes]]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def block_table(self, request_id: str) -> list[int]:
        return self.full.block_table(request_id)

    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    def group(self, kind: type[G]) -> G | None:
        """The model's group of class ``kind`` (None: the model keeps no such cache)."""
        return next((g for g in self.groups if isinstance(g, kind)), None)

    def take_cached_prefix(self, request: HasTokens, num_tokens: int) -> int:
        """Share every cached block matching the start of the request's first ``num_tokens``
        tokens that every group can resume after, keeping at least one to compute (so the
        request has logits to sample from); returns how many tokens are already computed.
        What the disk tier read for the request is put into the groups' memory first, so the
        prefix is taken from RAM either way."""
        request_id = request.request_id
        if self.prefix_root is None or self.full.block_table(request_id):
            return 0
        chain = self._chain(request, num_tokens)
        from_ram = 0
        if self.disk is not None:
            from_ram = self._resumable(self._in_ram(request, chain))
            self.disk.restore(request_id, chain)
        found = self._in_ram(request, chain)
        count = self._resumable(found)
        for group in self.groups:
            group.take_prefix(request_id, found, count)
        if count:
            self._hashes[request_id] = found[:count]
        if self.disk is not None:  # RAM blocks a later prompt reuses are worth keeping
            self.disk.keep(found[:count])
            self.disk.forget(request_id)
            self._from_disk[request_id] = max(0, count - from_ram) * self.block_size
        return count * self.block_size

    def _chain(self, request: HasTokens, num_tokens: int) -> list[bytes]:
        """The chain digests of the request's full blocks before its last token (hashed once:
        those ``prefetch`` hashed when the request was queued are taken here)."""
        queued = self._queued_chains.pop(request.request_id, None)
        if queued is not None and queued[0] == num_tokens:
            return queued[1]
        usable = (num_tokens - 1) // self.block_size
        tokens = request.hash_slice(0, usable * self.block_size)
        root = (self.prefix_root or b"") + request.cache_scope
        return chain_block_hashes(root, tokens, self.block_size)

    def _in_ram(self, request: HasTokens, chain: list[bytes]) -> list[bytes]:
        """The leading digests of ``chain`` the full group has cached, up to a point the
        request can resume at (not inside an image block that attends both ways: Gemma 4)."""
        found = chain[: self.full.find_prefix(chain)]
        while found and not request.can_resume_at(len(found) * self.block_size):
            found.pop()
        return found

    def disk_tokens(self, request_id: str) -> int:
        """Of the request's cached prefix, the tokens only the disk tier made resumable."""
        return self._from_disk.get(request_id, 0)

    def prefetch(self, request: HasTokens, num_tokens: int) -> None:
        """Start reading a queued request's prefix parts that are on disk and not in RAM, so
        they are in when it is scheduled."""
        if self.disk is not None:
            chain = self._chain(request, num_tokens)
            self._queued_chains[request.request_id] = (num_tokens, chain)
            self.disk.prefetch(request.request_id, chain)

    def prefix_ready(self, request_id: str) -> bool:
        """Whether a waiting request's blocks read from disk are in (it waits until they are,
        while others run)."""
        return self.disk is None or self.disk.ready(request_id)

    def _resumable(self, found: list[bytes]) -> int:
        """The most leading blocks of ``found`` every other group can resume after: each
        narrows it in turn, until all agree (a group that resumes after 4 blocks or 2, beside
        one that resumes after 3 or 2, agree on 2)."""
        count = len(found)
        while True:
            agreed = count
            for group in self._others:
                agreed = group.find_prefix(found[:agreed])
            if agreed == count:
                return count
            count = agreed

    def tokens_that_fit(self, request_id: str, num_computed: int) -> int:
        """How many more tokens the request could compute: the full group's room decides (a
        window group's cap holds every running request's window, so it never preempts)."""
        return self.full.tokens_that_fit(request_id, num_computed)

    def allocate_slots(self, request_id: str, num_computed: int, num_new: int) -> bool:
        """Give the request room for ``num_new`` tokens after its ``num_computed`` in every
        group, growing elastic pools first when too few blocks are free; False (and nothing
        more taken in any group) when a group has no room even so."""
        if not self._asked_each_step and self.full.has_room(request_id, num_computed + num_new):
            return True  # most decode steps: the last block has room
        num_blocks = self.blocks_for(num_computed + num_new)
        groups = self.groups
        if not all(g.make_room(request_id, num_computed, num_blocks) for g in groups):
            return False
        for group in groups:
            group.allocate(request_id, num_blocks)
        return True

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Give back the full group's blocks past the first ``num_tokens`` tokens (rejected
        drafts' slots: never named in the prefix cache, which names only known tokens). A window
        group's table keeps its entries: they are the positions the next drafts write; a
        recurrent state is restored by the speculator (``resume_from_snapshot``)."""
        self.full.truncate(request_id, self.blocks_for(num_tokens))

    def shrink(self) -> int:
        """Shrink the elastic pools when no request holds anything; returns the blocks given
        back."""
        return sum(group.shrink() for group in self.groups)

    def cache_full_blocks(self, request: HasTokens, num_tokens: int) -> None:
        """Name the request's blocks that the first ``num_tokens`` tokens fill (computed, or
        dispatched for computing) in the prefix cache, in every group."""
        if self.prefix_root is None:
            return
        held = len(self.full.block_table(request.request_id))
        if not held:
            return
        hashes = self._hashes.setdefault(request.request_id, [])
        full = min(num_tokens // self.block_size, held)
        done = len(hashes)
        if full <= done:
            return
        previous = hashes[-1] if done else self.prefix_root + request.cache_scope
        tokens = request.hash_slice(done * self.block_size, full * self.block_size)
        hashes.extend(chain_block_hashes(previous, tokens, self.block_size))
        for group in self.groups:
            group.register(request.request_id, hashes, done)
        if self.disk is not None:  # a prompt's blocks are worth keeping; a reply's are not
            prompt = min(full, request.num_prompt_tokens // self.block_size)
            self.disk.keep(hashes[done:prompt])

    def step_tables(self, chunks: Sequence[Chunk]) -> StepTables:
        """Every group's part of a step's tables for ``chunks`` (what the packer reads)."""
        tables = StepTables()
        for group in self.groups:
            group.add_tables(chunks, tables)
        return tables

    @property
    def bytes_used(self) -> int:
        """Bytes of every group's memory holding something (requests' or the prefix cache's)."""
        return sum(group.bytes_used for group in self.groups)

    def free(self, request_id: str) -> None:
        """Return everything the request holds in every group."""
        for group in self.groups:
            group.free(request_id)
        self._hashes.pop(request_id, None)
        self._from_disk.pop(request_id, None)
        self._queued_chains.pop(request_id, None)
        if self.disk is not None:
            self.disk.forget(request_id)
