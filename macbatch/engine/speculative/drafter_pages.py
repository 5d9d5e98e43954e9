"""The pages of a drafter that reads the target's states (an MTP layer, a DFlash drafter): one
more ``KVStore`` of its layers, indexed by the target's full group's block ids, so the pool
counts, caps, grows and gives back its rows with the target's (draft_runner.py's ``JointPages``).
No recurrent state. What the model runner asks of a draft beside its forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.config import EngineConfig
from macbatch.engine.model.compute_dtype import parameter_arrays
from macbatch.engine.speculative.layer_taps import LayerTaps
from macbatch.engine.stores.pages import KVStore, KVStores, LayerShape, PageFormat

if TYPE_CHECKING:
    from macbatch.engine.model.adapter import ModelAdapter


class DrafterPages:
    """``allocate`` gives the drafter its pages once the pool's size is known."""

    slots = None  # no recurrent state
    state_bytes_most = 0
    state_bytes_used = 0

    def __init__(self, shapes: list[LayerShape], dtype: mx.Dtype, config: EngineConfig) -> None:
        self.shapes = shapes
        self.format = PageFormat.of(dtype, config)
        self.block_size = config.block_size
        self.bytes_per_block = self.format.bytes_per_block(shapes, config.block_size)
        self.head_counts = {s.num_kv_heads for s in shapes}
        self._stores: KVStores | None = None

    def allocate(self, num_blocks: int) -> KVStore:
        """Its pages for ``num_blocks`` blocks (the target's full group's size)."""
        store = KVStore(self.shapes, num_blocks, self.block_size, self.format)
        self._stores = KVStores(store, None, [(False, i) for i in range(len(self.shapes))])
        return store

    def shrink(self) -> int:
        return 0  # nothing beside its pages, which shrink with the pool

    @property
    def stores(self) -> KVStores:
        assert self._stores is not None, "the drafter's pages are allocated with the pool"
        return self._stores

    @property
    def store(self) -> KVStore:
        return self.stores.full

    def arrays(self) -> list[mx.array]:
        return self.store.arrays()

    def features(self, hidden: mx.array) -> mx.array:
        """What the drafter keeps of a target forward whose last hidden states are ``hidden``."""
        raise NotImplementedError


class TappedDrafter(DrafterPages):
    """A drafter module that reads the target's layer outputs (DFlash, Eagle-3) beside the
    target's ``adapter``: cast to the target's compute dtype, the target's layers ``ids``
    recorded (layer_taps.py, named ``reader`` in its refusal), its pages ``layers`` layers of
    ``kv_heads`` x ``head_dim``."""

    def __init__(
        self,
        model: nn.Module,
        adapter: ModelAdapter,
        config: EngineConfig,
        ids: Sequence[int],
        reader: str,
        pages: tuple[int, int, int],
    ) -> None:
        """``pages``: the drafter's layers, KV heads and head size."""
        dtype = adapter.kv_dtype
        model.set_dtype(dtype)
        self.target = adapter
        self.taps = LayerTaps(adapter.layers, ids, reader)
        layers, kv_heads, head_dim = pages
        shape = LayerShape(num_kv_heads=kv_heads, head_dim=head_dim)
        super().__init__([shape] * layers, dtype, config)
        self.weights_nbytes = sum(a.nbytes for a in parameter_arrays(model))
