"""The DFlash drafter's paged forward beside the target (docs/speculative.md, "DFlash").

Its K/V pages live in the target's blocks, as an MTP layer's do (drafter_pages.py). A position's
page holds the context K/V of the target's features there; a block's rows write theirs over the
positions they draft at, which the target's features overwrite when it computes those positions.

The target's features are its decoder layers' outputs at ``target_layer_ids``, recorded as the
target's forward runs (layer_taps.py): the target runs as it always does, in one call, its
small decode steps compiled (the compiled graph returns the recorded outputs)."""

from __future__ import annotations

import mlx.core as mx

from macbatch.engine.config import EngineConfig
from macbatch.engine.model.adapter import ModelAdapter, PagedLayerCache
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.speculative.dflash_model import DFlashModel
from macbatch.engine.speculative.drafter_pages import TappedDrafter

Blocks = tuple[mx.array, list[int]]  # each block's known token, and how many it drafts


class DFlashRunner(TappedDrafter):
    """The drafter beside the target's ``adapter``, its pages in the target's blocks
    (drafter_pages.py). Offers what the model runner asks of a draft (draft_runner.py)."""

    def __init__(self, model: DFlashModel, adapter: ModelAdapter, config: EngineConfig) -> None:
        cfg = model.config
        pages = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
        ids = cfg.target_layer_ids
        super().__init__(model, adapter, config, ids, "the DFlash drafter", pages)
        self.model = model
        self.mask_token_id = cfg.mask_token_id
        self.max_drafts = cfg.max_drafts
        self.first_draft_row = cfg.first_draft_row
        self.causal = cfg.causal

    def features(self, hidden: mx.array) -> mx.array:
        """What the drafter keeps of a target forward: its tapped layers' outputs."""
        return self.taps.features()

    def _caches(self, batch: PackedBatch) -> list[PagedLayerCache]:
        return [PagedLayerCache(self.stores, i, batch, True) for i in range(len(self.shapes))]

    def write_context(self, batch: PackedBatch, features: mx.array) -> None:
        """Every layer's context K/V of the target's ``features`` ``[N, 1, k*H]`` at the
        batch's positions, written into the pages (lazy)."""
        context = self.model.context(features.astype(self.format.dtype))
        for layer, cache in zip(self.model.layers, self._caches(batch)):
            cache.update_and_fetch(
                *layer.self_attn.keys_values(context, self.model.rope, cache.offset)
            )

    def draft(
        self, batch: PackedBatch, within: mx.array, rows: mx.array, blocks: Blocks
    ) -> mx.array:
        """The drafts of a packed forward of blocks (``batch.image_blocks``: each block both
        ways, None where blocks are causal; ``within``: each row's index in its block) at its
        draft ``rows``, block after block (``blocks``: each one's known token and how many it
        drafts), as the drafter chooses them (lazy)."""
        embed = getattr(self.model, "embed_tokens", None) or self.target.inner.embed_tokens
        out = self.model(embed(batch.token_ids[:, None]), self._caches(batch), within)[rows]
        anchors, lengths = blocks
        return self.model.choose(out[:, 0], self.target.head(out), anchors, lengths)
