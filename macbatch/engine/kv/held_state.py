"""The cache group of a family whose layers keep the library's own caches per request
(DeepSeek V4: ``stores/held_caches.py``): a recurrent-state group whose rows name those caches.

Slots, snapshots and the RAM prefix cache's checkpoints work as a recurrent state's (a
checkpoint is the caches after a block boundary); the disk tier keeps none of it, since the held
caches are Python objects of the library's, not rows it can write, so its ``disk_part`` is None
and the tier stays off for such a model.
"""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.kv.disk.parts import CheckpointPart
from macbatch.engine.kv.recurrent_state import RecurrentStateGroup, RecurrentStateSpec
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

    def disk_part(self) -> CheckpointPart | None:
        """None: the disk tier cannot write the library's cache objects."""
        return None
