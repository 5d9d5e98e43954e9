"""Recurrent-state checkpoints for the prefix cache of a hybrid model.

An attention layer's cached prefix is its K/V blocks; a recurrent layer's is the state after the
prefix's last token, which no block holds. So at block boundaries a request's state is copied
into a checkpoint row of the ``StateStore`` (taken on demand: ``state_slots.py``), named by the
hash of the prefix's last full block: the same chain that names the cached K/V blocks. A request
whose prompt
shares a cached prefix resumes from the longest one with a checkpoint. Checkpoints are few (each
is a whole state, every recurrent layer's), so the least recently used one makes room.

A checkpoint is reserved when the step that fills it is packed, and named once the tokens of its
prefix are all known on the host (a decode's input token may still be in flight).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence


class StateCheckpoints:
    """The checkpoint rows of the state store: ``rows`` at first, more from ``grow`` (doubling,
    up to ``cap`` in all) before the least recently used one is given up."""

    def __init__(
        self, rows: list[int], cap: int, grow: Callable[[int], list[int]] | None = None
    ) -> None:
        self._free = rows[::-1]  # popped from the end: the lowest first
        self._named: OrderedDict[bytes, int] = OrderedDict()  # least recently used first
        self._pending: dict[str, dict[int, int]] = {}  # request -> {prefix blocks: slot}
        self.count = len(rows)
        self.cap = cap
        self._grow = grow
        self._least_growth = max(1, len(rows))  # what an emptied store grows back by

    def __len__(self) -> int:
        """How many checkpoints can be found now."""
        return len(self._named)

    def reserve(self, request_id: str, num_blocks: int) -> int:
        """A slot for the request's state after its first ``num_blocks`` blocks; -1 when every
        slot is waiting for its name (nothing to evict)."""
        pending = self._pending.setdefault(request_id, {})
        if num_blocks in pending:
            return pending[num_blocks]
        slot = self._take(())
        if slot >= 0:
            pending[num_blocks] = slot
        return slot

    def _take(self, keep: Collection[bytes]) -> int:
        """A row for a new checkpoint: a free one, a new one, or the least recently used named
        one not in ``keep`` (-1: none)."""
        if not self._free and self.count < self.cap and self._grow is not None:
            more = self._grow(min(self.cap, max(self._least_growth, 2 * self.count)) - self.count)
            self.count += len(more)
            self._free = more[::-1]
        if self._free:
            return self._free.pop()
        victim = next((d for d in self._named if d not in keep), None)
        return -1 if victim is None else self._named.pop(victim)

    def restore(self, digest: bytes, keep: Collection[bytes]) -> int:
        """A row named ``digest`` now (its state is the caller's to write: read from disk), or
        -1 when every row is held or in ``keep``."""
        slot = self._named.get(digest)
        if slot is not None:
            return slot
        slot = self._take(keep)
        if slot >= 0:
            self._named[digest] = slot
        return slot

    def peek(self, digest: bytes) -> int | None:
        """The row named ``digest`` (None: none), its recency unchanged."""
        return self._named.get(digest)

    def name(self, request_id: str, hashes: Sequence[bytes]) -> None:
        """Name the request's reserved checkpoints whose prefix is hashed now (``hashes``: its
        blocks' chain so far)."""
        pending = self._pending.get(request_id)
        if not pending:
            return
        for num_blocks in [n for n in pending if n <= len(hashes)]:
            slot, digest = pending.pop(num_blocks), hashes[num_blocks - 1]
            if digest in self._named:  # another request got there first: keep the older
                self._named.move_to_end(digest)
                self._free.append(slot)
            else:
                self._named[digest] = slot

    def find(self, digest: bytes) -> int | None:
        """The slot holding the state after the prefix ``digest`` names (now most recent)."""
        slot = self._named.get(digest)
        if slot is not None:
            self._named.move_to_end(digest)
        return slot

    def release(self, request_id: str) -> None:
        """Give back the request's reservations that never got their name."""
        self._free.extend(self._pending.pop(request_id, {}).values())

    def most_recent(self, count: int) -> list[int]:
        """The rows of the ``count`` most recently used named checkpoints, oldest first."""
        return list(self._named.values())[-count:] if count else []

    def renumber(self, rows: dict[int, int]) -> None:
        """After the store's ``compact``: the named checkpoints in ``rows`` (old row -> new) stay
        under their new rows, the others are gone, and no row is free (more come from ``grow``).
        Only while no reservation waits for its name."""
        assert not self._pending, "a checkpoint reservation is still waiting for its name"
        self._named = OrderedDict((d, rows[r]) for d, r in self._named.items() if r in rows)
        self._free = []
        self.count = len(self._named)
