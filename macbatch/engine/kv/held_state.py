"""The cache group of a family whose layers keep the library's own caches per request
(DeepSeek V4: ``stores/held_caches.py``): a recurrent-state group whose rows name those caches.

Slots, snapshots and the RAM prefix cache's checkpoints work as a recurrent state's (a
checkpoint is the caches after a block boundary); the disk tier keeps the checkpoints as the
held caches' arrays and scalar fields, rebuilt into the library's objects when read
(``HeldCheckpointPart``, ``stores/held_bytes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.kv.disk.parts import HeldCheckpointPart
from macbatch.engine.kv.recurrent_state import RecurrentStateGroup, RecurrentStateSpec
from macbatch.engine.stores.held_bytes import writable
from macbatch.engine.stores.held_caches import HeldCaches


@dataclass(frozen=True)
class HeldStateSpec(RecurrentStateSpec):
    """A recurrent state's spec whose rows are ``HeldCaches``."""


class HeldStateGroup(RecurrentStateGroup):
    def free(self, request_id: str) -> None:
        """Its slot, and the caches the slot named."""
        slot = self._slots.get(request_id)
        super().free(request_id)
        if slot is not None:
            store = self.slots.store
            assert isinstance(store, HeldCaches)
            store.release(slot)

    @property
    def bytes_used(self) -> int:
        """What the held caches reference (their rows' placeholders are next to nothing)."""
        store = self.slots.store
        assert isinstance(store, HeldCaches)
        return store.held_bytes()

    def disk_part(self) -> HeldCheckpointPart | None:
        """The held caches after a prefix's last block (None: prefix caching is off, or the
        library's caches hold a field ``held_bytes`` does not write)."""
        store = self.slots.store
        assert isinstance(store, HeldCaches)
        new = store.new_caches
        if self.checkpoints is None or new is None or not writable(new()):
            return None
        return HeldCheckpointPart(self.checkpoints, store)
