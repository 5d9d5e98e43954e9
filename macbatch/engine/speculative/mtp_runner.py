"""The MTP layer's paged forward: its K/V pages live in the target's blocks, as a draft model's do
(draft_runner.py): one more ``KVStore`` of one layer, indexed by the full group's block ids, so
the pool counts, caps, grows and gives back the MTP layer's rows with the target's. An MLA
layer's (DeepSeek V3, GLM-4.7-Flash) pages are latent pages, one row per token of
``kv_lora_rank + qk_rope_head_dim`` and no values (kv/latent.py), written and read by the
absorbed attention the latent hook installs on it, as on the target's layers; a sparse MLA
layer's (DeepSeek V3.2, GLM-5: its attention has a lightning indexer) keeps its indexer's keys as
a second store layer beside its latent rows, and selects each row's top-k positions over them as
the target's sparse layers do (model/sparse_indexer.py). Its inputs are the
next tokens' embeddings (the target's, unless the checkpoint has its own) and hidden states: the
target's, then its own output for the drafts after the first. Nemotron-H's MTP module is an
attention block then a MoE block: only the attention block has pages (one store layer per
attention block). Qwen4-exp's and DeepSeek V4's read the target's last layer's output (its
hyper-connection streams before the final mixer or head), recorded in the target's forward by a
layer tap (layer_taps.py); DeepSeek V4's one K/V head is its key and its value (its window
attention over them: hooks/shared_kv_window.py), beside a target whose own caches are held."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.config import EngineConfig
from macbatch.engine.model import hooks
from macbatch.engine.model.adapter import ModelAdapter, PagedLayerCache
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.compute_dtype import parameter_arrays
from macbatch.engine.model.hooks.latent_attention import is_latent_attention
from macbatch.engine.model.hooks.pooled_sparse_attention import is_pooled_attention
from macbatch.engine.model.pool_indexer import page_width, selection_plan
from macbatch.engine.speculative.drafter_pages import DrafterPages
from macbatch.engine.speculative.layer_taps import LayerTaps
from macbatch.engine.speculative.mtp_model import MtpHead
from macbatch.engine.stores.pages import LayerShape


class MtpRunner(DrafterPages):
    """The MTP layer beside the target's ``adapter``, its pages in the target's blocks
    (drafter_pages.py). Offers what the model runner asks of a draft (draft_runner.py)."""

    def __init__(self, head: MtpHead, adapter: ModelAdapter, config: EngineConfig) -> None:
        dtype = adapter.kv_dtype  # the target's compute dtype (cast already: compute_dtype.py)
        head.set_dtype(dtype)
        self.head = head
        self.target = adapter
        hooks.install(head.layers)  # the paged attention; an MLA layer's absorbed form
        paged = [layer for layer, pages in zip(head.layers, head.paged) if pages]
        # a sparse MLA layer's lightning indexer (the families with one ship one MTP layer)
        self.indexer = getattr(getattr(head.layers[0], "self_attn", None), "indexer", None)
        super().__init__(page_shapes(paged, adapter.model.args, self.indexer), dtype, config)
        # Qwen4-exp's reads the target's last layer's output (its unmixed streams)
        self.taps = (
            LayerTaps(adapter.layers, [len(adapter.layers) - 1], "the MTP layer")
            if head.reads_streams
            else None
        )
        self.max_rows = config.max_num_batched_tokens  # of one catch-up forward
        self.weights_nbytes = sum(a.nbytes for a in parameter_arrays(head))

    def features(self, hidden: mx.array) -> mx.array:
        """What the MTP layer keeps of a target forward: its last hidden states (Qwen4-exp's:
        its last layer's streams, before the final mixer)."""
        return hidden if self.taps is None else self.taps.features()

    def step(self, batch: PackedBatch, hidden: mx.array) -> tuple[mx.array, mx.array]:
        """One packed forward of the MTP layer over rows of next tokens (``batch.token_ids``)
        and hidden states ``[N, 1, H]``, its K/V written into its pages: the output rows of the
        sampled rows (the next draft's hidden states) and their argmax tokens (lazy)."""
        tokens = batch.token_ids[:, None]
        embed = getattr(self.head, "embed_tokens", None) or token_embedding(self.target.inner)
        caches = self._caches(batch)
        embedded = embed(tokens)
        if self.head.zeroes_first_embedding:
            embedded = mx.where((batch.positions == 0)[:, None, None], 0, embedded)
        out = self.head(embedded, hidden.astype(self.format.dtype), caches, tokens)
        if batch.sample_rows.size < batch.num_tokens:
            out = out[batch.sample_rows]
        read = self.head.readout(out)
        own = getattr(self.head, "lm_head", None)
        logits = own(read)[:, -1, :] if own is not None else self.target.head(read)
        return out, mx.argmax(logits, axis=-1)

    def _caches(self, batch: PackedBatch) -> list[PagedLayerCache | None]:
        """Each layer's paged cache for ``batch`` (None: a layer without pages): its latent (or
        K/V) pages, a sparse layer's also its indexer keys (the store layer after the pages)
        with the step's selection plan."""
        caches: list[PagedLayerCache | None] = []
        for pages in self.head.paged:
            if not pages:
                caches.append(None)
                continue
            layer = sum(c is not None for c in caches)
            if self.indexer is None:
                caches.append(PagedLayerCache(self.stores, layer, batch, True))
                continue
            plan = selection_plan(self.indexer, batch.attention, self.block_size)
            index = len(self.shapes) - 1
            caches.append(
                PagedLayerCache(self.stores, layer, batch, True, index_layer=index, plan=plan)
            )
        return caches


def token_embedding(inner: nn.Module) -> nn.Module:
    """The target's token embedding: its inner transformer's ``embed_tokens`` (Nemotron-H's
    ``embeddings``)."""
    embedding = getattr(inner, "embed_tokens", None)
    return embedding if embedding is not None else inner.embeddings


def page_shapes(layers: list[nn.Module], args: Any, indexer: Any) -> list[LayerShape]:
    """The store layers of the MTP layer's paged ``layers``: their pages, then its lightning
    ``indexer``'s key rows when it has one (one ``head_dim`` row per token, a pooling indexer's
    gate beside it, no values: kv/indexer_keys.py)."""
    shapes = [page_shape(layer, args) for layer in layers]
    if indexer is not None:
        shapes.append(LayerShape(1, page_width(indexer), value_dim=0))
    return shapes


def page_shape(layer: nn.Module, args: Any) -> LayerShape:
    """The pages of the decoder layer ``layer`` (its text config ``args``): an MLA attention's
    latent row (the latent, then the shared RoPE key, which GLM5-next's NoPE one has not; its
    values the latent), else a K and a V per KV head."""
    latent = next(
        (m for m in layer.children().values() if is_latent_attention(m) or is_pooled_attention(m)),
        None,
    )
    if latent is not None:
        rank = int(latent.kv_lora_rank)
        return LayerShape(1, rank + int(getattr(latent, "qk_rope_head_dim", 0)), value_dim=rank)
    head_dim = int(getattr(args, "head_dim", 0) or args.hidden_size // args.num_attention_heads)
    # DeepSeek V4's config names no K/V heads: its attention has one, its key its value too
    kv_heads = int(getattr(args, "num_key_value_heads", None) or 1)
    return LayerShape(num_kv_heads=kv_heads, head_dim=head_dim)
