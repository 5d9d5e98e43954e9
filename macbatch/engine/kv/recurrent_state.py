"""The recurrent-state cache group of a hybrid model (Qwen3.5, Falcon-H1, ...): per running
request a state slot, and the prefix cache's checkpoints, in rows of the runner's ``StateStore``
taken on demand (``state_slots.py``; ``checkpoints.py`` names them).

A recurrent layer keeps one state per sequence, not K/V per position, so this group holds no
blocks: a request takes its slot at its first allocation and keeps it until freed (the scheduler
runs at most as many requests as there are slots). Its cached prefix is a checkpoint, the state
after a block boundary named by the chain digest of the blocks before it, so it resumes after
the longest cached prefix with a checkpoint; its part of a step is how each chunk's state flows
(what it starts from, where it leaves its state, which checkpoint it fills).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from macbatch.engine.kv.disk.parts import CheckpointPart
from macbatch.engine.kv.group import CacheSpec, Chunk, StepTables
from macbatch.engine.kv.state_slots import StateMemory, StateSlots
from macbatch.engine.model.recurrent import StateChunk


@dataclass(frozen=True)
class RecurrentStateSpec(CacheSpec):
    bytes_per_state: int  # every recurrent layer's state of one sequence


class RecurrentStateGroup:
    per_request = True

    def __init__(self, spec: RecurrentStateSpec, memory: StateMemory, block_size: int) -> None:
        self.spec = spec
        self.block_size = block_size
        self.slots = StateSlots(memory.store, memory.sizes)
        self.checkpoints = self.slots.checkpoints  # None: prefix caching is off
        self._slots: dict[str, int] = {}
        self._resume: dict[str, int] = {}  # request -> checkpoint slot its first chunk reads
        # request -> tokens of cached K/V it found without a checkpoint: its chunk checkpoints
        # there, so the next request with that prefix resumes (a job's shared system prompt)
        self._shared_end: dict[str, int] = {}

    @property
    def slots_in_use(self) -> int:
        return len(self._slots)

    def make_room(self, request_id: str, num_computed: int, num_blocks: int) -> bool:
        """Always: a running request gets a slot (``StateSlots.take`` grows up to
        ``max_num_seqs``, and the scheduler never runs more)."""
        return True

    def allocate(self, request_id: str, num_blocks: int) -> None:
        if request_id not in self._slots:
            self._slots[request_id] = self.slots.take()

    def free(self, request_id: str) -> None:
        """Its slot, and its checkpoint reservations that never got their name."""
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            self.slots.give_back(slot)
        self._resume.pop(request_id, None)
        self._shared_end.pop(request_id, None)
        if self.checkpoints is not None:
            self.checkpoints.release(request_id)

    def find_prefix(self, hashes: Sequence[bytes]) -> int:
        """The longest prefix of ``hashes`` with a checkpoint (0: none)."""
        if self.checkpoints is None:
            return 0
        for count in range(len(hashes), 0, -1):
            if self.checkpoints.find(hashes[count - 1]) is not None:
                return count
        return 0

    def take_prefix(self, request_id: str, hashes: Sequence[bytes], num_blocks: int) -> None:
        """Note the checkpoint its first chunk reads, and where its cached K/V ends when that is
        past the checkpoint."""
        if len(hashes) > num_blocks:
            self._shared_end[request_id] = len(hashes) * self.block_size
        if num_blocks:
            assert self.checkpoints is not None
            slot = self.checkpoints.find(hashes[num_blocks - 1])
            assert slot is not None, "found, and nothing was taken since"
            self._resume[request_id] = slot

    def register(self, request_id: str, hashes: Sequence[bytes], first: int) -> None:
        """Name the request's reserved checkpoints whose prefix is hashed now."""
        if self.checkpoints is not None:
            self.checkpoints.name(request_id, hashes)

    def add_tables(self, chunks: Sequence[Chunk], tables: StepTables) -> None:
        tables.states = [self._flow(c) for c in chunks]

    def _flow(self, chunk: Chunk) -> StateChunk:
        """How a chunk's recurrent state flows: from the checkpoint the request resumes after,
        its own slot, or zeros (its first token); into its own slot; and, when the chunk crosses
        a block boundary, into a checkpoint at the last one."""
        request_id, start = chunk.request.request_id, chunk.start
        if chunk.num_drafts:
            return self._verify_flow(request_id)
        slot = self._slots[request_id]
        read = self._resume.pop(request_id, slot if start else -1)
        end = start + chunk.num_tokens
        boundary = end // self.block_size * self.block_size
        if end == boundary == chunk.request.num_prompt_tokens:
            # A prompt that ends on a boundary: the same prompt again resumes at most one token
            # before its end, so its checkpoint goes one block earlier, where a repeat can resume.
            boundary -= self.block_size
        shared_end = self._shared_end.get(request_id, 0)
        if shared_end <= boundary:
            self._shared_end.pop(request_id, None)
            boundary = shared_end if shared_end > start else boundary
        if self.checkpoints is None or boundary <= start:
            return StateChunk(read, slot)
        checkpoint = self.checkpoints.reserve(request_id, boundary // self.block_size)
        if checkpoint < 0:
            return StateChunk(read, slot)
        return StateChunk(read, slot, checkpoint, boundary - start)

    def _verify_flow(self, request_id: str) -> StateChunk:
        """A verification chunk's (its request decoding, so holding its slot): from and into its
        slot, and the state after its first token (the last known one) into the slot's snapshot,
        to restore when drafts are rejected. No prefix checkpoint: the drafts' states may be
        rejected."""
        slot = self._slots[request_id]
        snapshot = self.slots.store.snapshot_of(slot)
        return StateChunk(self._resume.pop(request_id, slot), slot, snapshot, 1)

    def resume_from_snapshot(self, request_id: str) -> None:
        """The request's next chunk starts from its slot's snapshot (its drafts rejected)
        instead of its slot. It travels in that chunk's state rows, so every rank of a group
        reads the same slot (no copy made on rank 0 alone)."""
        self._resume[request_id] = self.slots.store.snapshot_of(self._slots[request_id])

    @property
    def bytes_used(self) -> int:
        """Running requests' slots and the prefix cache's checkpoints."""
        checkpoints = 0 if self.checkpoints is None else len(self.checkpoints)
        return (len(self._slots) + checkpoints) * self.spec.bytes_per_state

    def shrink(self) -> int:
        """Its rows back to their start (``StateSlots.shrink``); 0: rows are not blocks."""
        self.slots.shrink()
        return 0

    def disk_part(self) -> CheckpointPart | None:
        """The checkpoint after a prefix's last block (None: prefix caching is off)."""
        if self.checkpoints is None:
            return None
        return CheckpointPart(self.checkpoints, self.slots.store)
