"""A hybrid model's state rows, taken on demand like the elastic pool's blocks.

A request slot holds every recurrent layer's state for one running request, and a checkpoint the
state after a cached prefix (a few MB each for a big model). Sized for ``max_num_seqs`` slots and
the checkpoint budget at load, the store took what the busiest load could use (1.5 GB of
checkpoints for a Qwen3.5-0.8B-shaped model on a 24 GB machine) whatever the load. Now it starts
with a few of each and appends rows (doubling, ``GROWTH_FACTOR``, as the KV pool) when a request
finds no free slot or a prompt no free checkpoint, up to ``max_num_seqs`` slots (the scheduler
never runs more requests at once, so a running request always gets one) and the checkpoint cap
(past it, the least recently used checkpoint makes room). When no request holds a slot, the store
goes back to its start size: fresh request slots and the most recently used checkpoints, as many
as it started with (the elastic KV pool keeps its most recently used prefix blocks the same way).
A fixed pool (``num_blocks``, a distributed group whose ranks must agree on shapes) has every row
from the start and never resizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.config import EngineConfig
from macbatch.engine.kv.checkpoints import StateCheckpoints
from macbatch.engine.kv.elastic import GROWTH_FACTOR
from macbatch.engine.stores.state_store import StateStore

# Request slots an elastic store starts with (and shrinks back to): a chat, or a few requests.
START_SLOTS = 4
# Checkpoints an elastic store starts with: a few conversations' latest turns.
START_CHECKPOINTS = 8


@dataclass(frozen=True)
class StateSizes:
    """How many request slots and checkpoints the store starts with and may grow to."""

    slots: int
    slots_cap: int
    checkpoints: int
    checkpoints_cap: int


@dataclass(frozen=True)
class StateMemory:
    """What the model runner gives the recurrent-state group: its state rows and their sizes."""

    store: StateStore
    sizes: StateSizes


def state_sizes(
    config: EngineConfig, bytes_per_state: int, kv_bytes: int, fixed: bool
) -> StateSizes:
    """The checkpoint cap is an eighth of the K/V pool's bytes at its cap, at least 8 and at
    most 4 per running request (none without prefix caching)."""
    most = config.max_num_seqs
    checkpoints = 0
    if config.enable_prefix_caching:
        checkpoints = min(4 * most, max(8, kv_bytes // 8 // bytes_per_state))
    if fixed:
        return StateSizes(most, most, checkpoints, checkpoints)
    return StateSizes(
        min(most, START_SLOTS), most, min(checkpoints, START_CHECKPOINTS), checkpoints
    )


class StateSlots:
    """The request slots of ``store`` (its first rows at start) and its checkpoints (the rows
    after them), growing both up to ``sizes``' caps."""

    def __init__(self, store: StateStore, sizes: StateSizes) -> None:
        self.store = store
        self.sizes = sizes
        self.num_slots = sizes.slots
        self._free = self._slot_rows(range(sizes.slots * store.stride))
        self.in_use = 0
        first = sizes.slots * store.stride
        rows = list(range(first, first + sizes.checkpoints))
        self.checkpoints = (
            StateCheckpoints(rows, sizes.checkpoints_cap, store.append)
            if sizes.checkpoints_cap
            else None
        )

    def _slot_rows(self, rows: range | list[int]) -> list[int]:
        """Request slots in ``rows`` (a slot, then its snapshot), popped from the end: the lowest
        first."""
        return list(rows)[:: self.store.stride][::-1]

    def take(self) -> int:
        """A free slot's row, growing the store when none is free."""
        if not self._free:
            assert self.num_slots < self.sizes.slots_cap, "more running requests than max_num_seqs"
            more = min(self.sizes.slots_cap, self.num_slots * GROWTH_FACTOR) - self.num_slots
            self._free = self._slot_rows(self.store.append(more * self.store.stride))
            self.num_slots += more
        self.in_use += 1
        return self._free.pop()

    def give_back(self, slot: int) -> None:
        self._free.append(slot)
        self.in_use -= 1

    def shrink(self) -> int:
        """Back to the start size when no request holds a slot (keeping the most recently used
        checkpoints, as many as at start); the rows given back."""
        fresh = self.sizes.slots * self.store.stride
        start = fresh + self.sizes.checkpoints
        before = self.store.rows
        if self.in_use or before <= start:
            return 0
        named = self.checkpoints
        kept = [] if named is None else named.most_recent(self.sizes.checkpoints)
        self.store.compact(fresh, kept)
        if named is not None:
            named.renumber({row: fresh + i for i, row in enumerate(kept)})
        self.num_slots = self.sizes.slots
        self._free = self._slot_rows(range(fresh))
        return before - self.store.rows
