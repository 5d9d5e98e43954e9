"""The Eagle-3 drafter's paged forward beside the target (docs/speculative.md, "Eagle-3").

Eagle-3 drafts as an MTP layer does (one packed forward per draft token, its K/V at position
``t`` read from token ``t + 1`` and the feature at ``t``), so ``MtpDrafter`` (mtp.py) runs it;
this runner is what differs: the feature it keeps of a target forward is ``fc`` over the
target's recorded layer outputs (layer_taps.py; a compiled decode step returns them), and its drafts
come from its own draft vocabulary mapped to the target's. Its pages live in the target's
blocks (drafter_pages.py)."""

from __future__ import annotations

import mlx.core as mx

from macbatch.engine.config import EngineConfig
from macbatch.engine.model.adapter import ModelAdapter, PagedLayerCache
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.speculative.drafter_pages import TappedDrafter
from macbatch.engine.speculative.eagle3_model import Eagle3Model


class Eagle3Runner(TappedDrafter):
    """The drafter beside the target's ``adapter``. Offers what the model runner asks of a
    draft (draft_runner.py) and what ``MtpDrafter`` asks of its runner (``step``)."""

    def __init__(self, model: Eagle3Model, adapter: ModelAdapter, config: EngineConfig) -> None:
        cfg = model.config
        ids = cfg.target_layers(len(adapter.layers))
        pages = (1, cfg.num_key_value_heads, cfg.head_dim)
        super().__init__(model, adapter, config, ids, "the Eagle-3 drafter", pages)
        self.model = model
        self.max_rows = config.max_num_batched_tokens  # of one catch-up forward

    def features(self, hidden: mx.array) -> mx.array:
        """What the drafter keeps of a target forward: its tapped layers' outputs through
        ``fc`` (lazy: computed only for the rows a drafter keeps)."""
        return self.model.fc(self.taps.features().astype(self.format.dtype))

    def step(self, batch: PackedBatch, hidden: mx.array) -> tuple[mx.array, mx.array]:
        """One packed forward over rows of next tokens (``batch.token_ids``) and features
        ``[N, 1, H]``, its K/V written into its pages: the sampled rows' outputs (the next
        draft's features) and their drafts in the target's ids (lazy)."""
        embed = getattr(self.model, "embed_tokens", None) or self.target.inner.embed_tokens
        cache = PagedLayerCache(self.stores, 0, batch, True)
        out = self.model(embed(batch.token_ids[:, None]), hidden.astype(self.format.dtype), cache)
        if batch.sample_rows.size < batch.num_tokens:
            out = out[batch.sample_rows]
        return out, self.model.draft_tokens(out)
