"""The one owner of KV blocks: which blocks each request holds, sharing a cached prefix, naming
full blocks in the prefix cache, freeing, and the block tables the packer reads.

Cache groups: the full-attention layers' blocks (here), a model's sliding-window layers' blocks
(``WindowBlocks``: only the window, in a pool of their own) and a hybrid model's recurrent state
slots. The scheduler asks this one manager for room in all of them, and freeing a request frees
all of them.

The scheduler decides who runs (policy); this module does the block arithmetic it asks for. A
request's token at position p lives in ``block_table(rid)[p // block_size]`` at offset
``p % block_size``. Requests are read (ids and tokens), never changed: how many tokens are
computed is the scheduler's to track.
"""

from __future__ import annotations

from typing import Protocol

from macbatch.arithmetic import ceil_div
from macbatch.engine.kv.block_pool import BlockPool, chain_block_hashes
from macbatch.engine.kv.checkpoints import StateCheckpoints
from macbatch.engine.kv.elastic import ElasticPool
from macbatch.engine.kv.state_slots import StateSlots
from macbatch.engine.kv.window import WindowBlocks
from macbatch.engine.model.recurrent import StateChunk


class HasTokens(Protocol):
    """What the KV manager reads of a request."""

    request_id: str

    def hash_slice(self, start: int, stop: int) -> list[int]: ...

    def can_resume_at(self, position: int) -> bool: ...


class KVManager:
    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        prefix_root: bytes | None,
        state_slots: StateSlots | None = None,
        checkpoints: StateCheckpoints | None = None,
        elastic: ElasticPool | None = None,
        window: WindowBlocks | None = None,
    ) -> None:
        """``state_slots``: a hybrid model's recurrent-state slots (one per running request,
        taken on demand; None for a model with attention only); ``checkpoints``: its prefix
        cache's states (None: a cached prefix needs none, or prefix caching is off);
        ``elastic``: grows ``pool`` (and its pages) when too few blocks are free (None: a fixed
        pool); ``window``: the sliding-window layers' group (None: the model has none)."""
        self.pool = pool
        self.elastic = elastic
        self.window = window
        self.block_size = block_size
        self.prefix_root = prefix_root  # None: prefix caching off
        self._blocks: dict[str, list[int]] = {}
        self._hashes: dict[str, list[bytes]] = {}  # of the request's first cached blocks
        self.hybrid = state_slots is not None
        self.state_slots = state_slots
        self._slots: dict[str, int] = {}
        self.checkpoints = checkpoints
        self._resume: dict[str, int] = {}  # request -> checkpoint slot its first chunk reads
        # request -> tokens of cached K/V it found without a checkpoint: its chunk checkpoints
        # there, so the next request with that prefix resumes (a job's shared system prompt)
        self._shared_end: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def block_table(self, request_id: str) -> list[int]:
        return self._blocks.get(request_id, [])

    def window_table(self, request_id: str) -> list[int]:
        """The request's block table in the window group (block 0 where a block left the
        window)."""
        assert self.window is not None
        return self.window.block_table(request_id)

    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    def take_cached_prefix(self, request: HasTokens, num_tokens: int) -> int:
        """Share every cached block matching the start of the request's first ``num_tokens``
        tokens, keeping at least one to compute (so the request has logits to sample from);
        returns how many tokens are already computed."""
        if self.prefix_root is None or request.request_id in self._blocks:
            return 0
        usable = (num_tokens - 1) // self.block_size
        tokens = request.hash_slice(0, usable * self.block_size)
        blocks, hashes = [], []
        for digest in chain_block_hashes(self.prefix_root, tokens, self.block_size):
            block = self.pool.lookup(digest)
            if block is None:
                break
            blocks.append(block)
            hashes.append(digest)
        while blocks and not request.can_resume_at(len(blocks) * self.block_size):
            blocks.pop()  # not inside an image block that attends both ways (Gemma 4)
            hashes.pop()
        if self.hybrid:
            resumable = self._resumable(request.request_id, hashes)
            if len(blocks) > resumable:
                self._shared_end[request.request_id] = len(blocks) * self.block_size
            blocks, hashes = blocks[:resumable], hashes[:resumable]
        if self.window is not None and hashes:  # also the window before the resume point
            usable = self.window.take_prefix(request.request_id, hashes)
            blocks, hashes = blocks[:usable], hashes[:usable]
        for block in blocks:
            self.pool.share(block)
        if blocks:
            self._blocks[request.request_id] = blocks
            self._hashes[request.request_id] = hashes
        return len(blocks) * self.block_size

    def _resumable(self, request_id: str, hashes: list[bytes]) -> int:
        """The most leading blocks of ``hashes`` a recurrent state can resume after (the
        longest prefix with a checkpoint; 0 without one), noting the checkpoint to read."""
        if self.checkpoints is None:
            return 0
        for count in range(len(hashes), 0, -1):
            slot = self.checkpoints.find(hashes[count - 1])
            if slot is not None:
                self._resume[request_id] = slot
                return count
        return 0

    def tokens_that_fit(self, request_id: str, num_computed: int) -> int:
        """How many more tokens the request could compute with its blocks, all free ones and
        those the pool may still grow by."""
        held = len(self.block_table(request_id))
        room = 0 if self.elastic is None else self.elastic.room
        return (held + self.pool.num_free + room) * self.block_size - num_computed

    def allocate_slots(self, request_id: str, num_computed: int, num_new: int) -> bool:
        """Give the request blocks for ``num_new`` tokens after its ``num_computed`` in every
        group (the window group first gives back what left the window), growing an elastic pool
        first when too few are free; False (and nothing more taken) when a pool has too few free
        even so."""
        blocks = self._blocks.setdefault(request_id, [])
        needed = self.blocks_for(num_computed + num_new)
        missing = needed - len(blocks)
        if missing <= 0 and self.window is None:  # most decode steps: the last block has room
            return True
        if (missing > 0 and missing > self.pool.num_free) and not (
            self.elastic is not None and self.elastic.make_room(missing)
        ):
            if not blocks:
                del self._blocks[request_id]
            return False
        if self.window is not None and not self.window.allocate(request_id, num_computed, needed):
            if not blocks:
                del self._blocks[request_id]
            return False
        blocks.extend(self.pool.allocate() for _ in range(missing))
        return True

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Give back the full group's blocks past the first ``num_tokens`` tokens (rejected
        drafts' slots: never named in the prefix cache, which names only known tokens). A window
        group's table keeps its entries: they are the positions the next drafts write."""
        blocks = self._blocks.get(request_id)
        if not blocks:
            return
        keep = self.blocks_for(num_tokens)
        while len(blocks) > keep:
            self.pool.free(blocks.pop())

    def shrink(self) -> int:
        """Shrink the elastic pools (``ElasticPool.shrink``) when no request holds a block;
        returns the blocks given back."""
        if self._blocks:
            return 0
        window = 0 if self.window is None else self.window.shrink()
        if self.state_slots is not None:
            self.state_slots.shrink()
        return window + (0 if self.elastic is None else self.elastic.shrink())

    def cache_full_blocks(self, request: HasTokens, num_tokens: int) -> None:
        """Name the request's blocks that the first ``num_tokens`` tokens fill (computed, or
        dispatched for computing) in the prefix cache."""
        if self.prefix_root is None:
            return
        blocks = self._blocks.get(request.request_id)
        if not blocks:
            return
        hashes = self._hashes.setdefault(request.request_id, [])
        full = min(num_tokens // self.block_size, len(blocks))
        done = len(hashes)
        if full <= done:
            return
        previous = hashes[-1] if done else self.prefix_root
        tokens = request.hash_slice(done * self.block_size, full * self.block_size)
        new = chain_block_hashes(previous, tokens, self.block_size)
        for block, digest in zip(blocks[done:full], new):
            self.pool.register(block, digest)
        if self.window is not None:
            self.window.register(request.request_id, done, new)
        hashes.extend(new)
        if self.checkpoints is not None:
            self.checkpoints.name(request.request_id, hashes)

    @property
    def state_slots_in_use(self) -> int:
        return len(self._slots)

    def state_chunk(self, request_id: str, start: int, num_tokens: int) -> StateChunk:
        """How a chunk's recurrent state flows: from the checkpoint the request resumes after, its
        own slot, or zeros (its first token); into its own slot (taken when it first runs and kept
        until ``free``: the scheduler runs at most as many requests as there are slots); and,
        when the chunk crosses a block boundary, into a checkpoint at the last one."""
        slot = self._slots.get(request_id)
        if slot is None:
            assert self.state_slots is not None
            slot = self._slots[request_id] = self.state_slots.take()
        read = self._resume.pop(request_id, slot if start else -1)
        boundary = (start + num_tokens) // self.block_size * self.block_size
        shared_end = self._shared_end.get(request_id, 0)
        if shared_end <= boundary:
            self._shared_end.pop(request_id, None)
            boundary = shared_end if shared_end > start else boundary
        if self.checkpoints is None or self.prefix_root is None or boundary <= start:
            return StateChunk(read, slot)
        checkpoint = self.checkpoints.reserve(request_id, boundary // self.block_size)
        if checkpoint < 0:
            return StateChunk(read, slot)
        return StateChunk(read, slot, checkpoint, boundary - start)

    def verify_state_chunk(self, request_id: str, snapshot: int) -> StateChunk:
        """A verification chunk's state flow (its request decoding, so holding its slot): from
        and into its slot, and the state after its first token (the last known one) into
        ``snapshot``, to restore when drafts are rejected. No prefix checkpoint: the drafts'
        states may be rejected."""
        slot = self._slots[request_id]
        return StateChunk(self._resume.pop(request_id, slot), slot, snapshot, 1)

    def state_slot(self, request_id: str) -> int:
        return self._slots[request_id]

    def resume_state_from(self, request_id: str, slot: int) -> None:
        """The request's next chunk starts from state ``slot`` (a verification's snapshot, its
        drafts rejected) instead of its own. It travels in that chunk's state rows, so every
        rank of a group reads the same slot (no copy made on rank 0 alone)."""
        self._resume[request_id] = slot

    def free(self, request_id: str) -> None:
        """Return all of a request's blocks (the last first, so a prefix's earlier blocks stay
        cached longest) and its state slot."""
        slot = self._slots.pop(request_id, None)
        if slot is not None and self.state_slots is not None:
            self.state_slots.give_back(slot)
        self._resume.pop(request_id, None)
        self._shared_end.pop(request_id, None)
        if self.checkpoints is not None:
            self.checkpoints.release(request_id)
        for block in reversed(self._blocks.pop(request_id, [])):
            self.pool.free(block)
        self._hashes.pop(request_id, None)
        if self.window is not None:
            self.window.free(request_id)
