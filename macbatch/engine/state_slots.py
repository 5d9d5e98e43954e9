"""A hybrid model's request state slots, taken on demand like the elastic pool's blocks.

A slot holds every recurrent layer's state for one running request (a few MB for a big model).
Sized for ``max_num_seqs`` at load, 64 of them were taken at start whatever the load. Now the
store starts with a few and doubles (``GROWTH_FACTOR``, as the KV pool) when a request finds none
free, up to ``max_num_seqs`` (the scheduler never runs more requests at once, so a running
request always gets one); when the engine is idle and no request holds a slot, it goes back to
its start size. Request slots sit after the checkpoints in the store, so resizing moves neither
the checkpoints nor a held slot. A fixed pool (``num_blocks``, a distributed group whose ranks
must agree on shapes) keeps ``max_num_seqs`` slots from the start.
"""

from __future__ import annotations

from macbatch.engine.elastic_pool import GROWTH_FACTOR
from macbatch.engine.recurrent import StateStore

# Request slots an elastic store starts with (and shrinks back to): a chat, or a few requests.
START_SLOTS = 4


class StateSlots:
    """The free and held request slots of ``store``, growing it up to ``cap`` slots."""

    def __init__(self, store: StateStore, cap: int) -> None:
        self.store = store
        self.cap = cap
        self.start = store.num_slots
        self._free = self._rows(0, store.num_slots)
        self.in_use = 0

    def _rows(self, first: int, stop: int) -> list[int]:
        """Store rows of request slots ``first`` to ``stop - 1``, popped from the end: the
        lowest first."""
        return [self.store.slot(k) for k in range(stop - 1, first - 1, -1)]

    def take(self) -> int:
        """A free slot's row, growing the store when none is free."""
        if not self._free:
            old = self.store.num_slots
            assert old < self.cap, "more running requests than max_num_seqs"
            new = min(self.cap, old * GROWTH_FACTOR)
            self.store.resize(new)
            self._free = self._rows(old, new)
        self.in_use += 1
        return self._free.pop()

    def give_back(self, slot: int) -> None:
        self._free.append(slot)
        self.in_use -= 1

    def shrink(self) -> int:
        """Back to the start size when no request holds a slot; the slots given back."""
        given_back = self.store.num_slots - self.start
        if self.in_use or given_back <= 0:
            return 0
        self.store.resize(self.start)
        self._free = self._rows(0, self.start)
        return given_back


def start_slots(max_num_seqs: int, elastic: bool) -> int:
    """How many request slots a store starts with."""
    return min(max_num_seqs, START_SLOTS) if elastic else max_num_seqs
