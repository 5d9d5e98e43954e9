"""A draft model's paged forward: its pages live in the target's blocks (docs/speculative.md).

The draft runs through the same machinery as the target (``ModelAdapter``, ``pack``, paged
attention), with its own page arrays: one more ``KVStore``, indexed by the same block ids as
the target's full-attention group. A block of the pool therefore holds a span of positions for
both models, and a request's one block table addresses both: the draft's K/V is counted in the
pool's bytes, capped by its budget, grown and shrunk with it (``JointPages``), and given back
when the target's blocks are (truncated rejected drafts, preemption, finish). The price is the
draft's bytes in every block, speculating or not: a draft of 2 layers beside 28 adds 1/14 to
a block. A hybrid draft (recurrent layers) also keeps a state slot and its snapshot per
request that drafts (draft_model.py says how they are used).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from macbatch.engine.config import EngineConfig
from macbatch.engine.kv.state_slots import START_SLOTS, StateSizes, StateSlots
from macbatch.engine.model.adapter import ModelAdapter
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.compute_dtype import parameter_arrays, settle_compute_dtype
from macbatch.engine.stores.pages import KVStore, KVStores, PageFormat
from macbatch.engine.stores.state_store import StateStore, slot_stride


class DraftRunner:
    """The draft model's adapter, page format and pages. ``allocate`` gives it its pages once
    the pool's size is known (the pool's size counts the draft's bytes per block)."""

    def __init__(
        self, model: nn.Module, config: EngineConfig, target_vocab_size: int, owns_model: bool
    ) -> None:
        vocab = getattr(getattr(model, "args", None), "vocab_size", None)
        if vocab is not None and vocab != target_vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({vocab} tokens) is not the target's "
                f"({target_vocab_size}): a draft model must share the target's tokenizer"
            )
        settle_compute_dtype(model, config.dtype, owns_model)
        # every layer in one group: the draft reads the target's full-group block tables
        self.adapter = ModelAdapter(model, windows=False)
        self.format = PageFormat.of(self.adapter.kv_dtype, config)
        self.block_size = config.block_size
        self.max_rows = config.max_num_batched_tokens  # of one draft forward (catch-ups)
        self.bytes_per_block = self.format.bytes_per_block(
            self.adapter.layer_shapes, config.block_size
        )
        self.head_counts = {s.num_kv_heads for s in self.adapter.layer_shapes}
        self.weights_nbytes = sum(a.nbytes for a in parameter_arrays(self.adapter.model))
        self._stores: KVStores | None = None
        # A hybrid draft's recurrent state: per request a slot (its state after its known
        # tokens) and the slot's snapshot, which the drafts run through and may be thrown away.
        self.states: StateStore | None = None
        self.slots: StateSlots | None = None
        if self.adapter.hybrid:
            # slots only (no checkpoints: the draft never resumes from a cached prefix)
            most = config.max_num_seqs
            sizes = StateSizes(min(most, START_SLOTS), most, 0, 0)
            rows = sizes.slots * slot_stride(True)
            self.states = StateStore(self.adapter.state_shapes, rows, snapshots=True)
            self.slots = StateSlots(self.states, sizes)
        per_request = 0 if self.states is None else 2 * self.states.bytes_per_slot
        self.state_bytes_most = config.max_num_seqs * per_request  # reserved beside the pool

    def allocate(self, num_blocks: int) -> KVStore:
        """Its pages for ``num_blocks`` blocks (the target's full group's size)."""
        store = KVStore(self.adapter.layer_shapes, num_blocks, self.block_size, self.format)
        self._stores = KVStores(store, None, self.adapter.kv_slots)
        return store

    @property
    def state_bytes_used(self) -> int:
        """A hybrid draft's slots and snapshots held by requests (0 for attention only)."""
        if self.states is None or self.slots is None:
            return 0
        return self.slots.in_use * 2 * self.states.bytes_per_slot

    def shrink(self) -> int:
        """A hybrid draft's state rows back to their start size when no request holds a slot
        (with the pool's idle shrink); the rows given back."""
        return 0 if self.slots is None else self.slots.shrink()

    def arrays(self) -> list[mx.array]:
        """What a draft forward writes: its pages and a hybrid draft's states."""
        states = [] if self.states is None else self.states.arrays()
        return self.store.arrays() + states

    @property
    def store(self) -> KVStore:
        assert self._stores is not None, "the draft's pages are allocated with the pool"
        return self._stores.full

    def greedy(self, batch: PackedBatch) -> mx.array:
        """The argmax token of each sampled row of one packed draft step (lazy), its K/V
        written into the draft's pages."""
        assert self._stores is not None
        logits = self.adapter.forward(batch, self._stores, self.states)
        assert logits is not None, "a draft step samples every request's last row"
        return mx.argmax(logits, axis=-1)


class JointPages:
    """The target's full-group pages and the draft's, resized together: the same block ids
    (``ElasticPool`` grows and compacts them as one)."""

    def __init__(self, *stores: KVStore) -> None:
        self.stores = stores

    def resize(self, num_blocks: int, keep: Sequence[int] | None = None) -> None:
        for store in self.stores:
            store.resize(num_blocks, keep)

    # The disk tier keeps a block's target pages alone (kv/disk/parts.py): the draft's pages of
    # a block are written by its catch-up after the block is named, and every request that
    # resumes a cached prefix has its draft catch up from position 0 (``DraftModelDrafter``),
    # so they are never read before being written again.

    def block_slab_bytes(self) -> list[int]:
        return self.stores[0].block_slab_bytes()

    def gather_blocks(self, blocks: Sequence[int]) -> list[mx.array]:
        return self.stores[0].gather_blocks(blocks)

    def scatter_blocks(self, blocks: Sequence[int], slabs: Sequence[np.ndarray]) -> None:
        self.stores[0].scatter_blocks(blocks, slabs)
