"""DeBERTa-v2 / v3 in MLX over packed rows (macbatch's own code, from the architecture): BERT's
post-LayerNorm block whose attention is disentangled. Besides content to content (q . k), each
score adds content to position (q_i . key(r)) and position to content (k_j . query(r)) terms,
``r`` the LayerNorm'd relative embedding of the log bucket of i - j, all over
``sqrt(head_dim * terms)``; the relative embeddings' projections are the layer's own query and
key (``share_att_key``) or ``pos_query_proj`` / ``pos_key_proj``."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from macbatch.engine.encoder import bert
from macbatch.engine.encoder.config import Disentangled, EncoderConfig
from macbatch.engine.encoder.varlen import VarlenLayout
from macbatch.engine.encoder.weights import renamed


def relative_index(length: int, d: Disentangled) -> mx.array:
    """[length, length] int32: the relative embedding row pair (i, j) reads, the bucket of
    i - j (log buckets past half of ``buckets``, up to ``max_relative``) shifted by the span
    and clipped into its 2 * span rows."""
    offsets = np.arange(length)[:, None] - np.arange(length)[None, :]
    if d.buckets > 0:
        mid = d.buckets // 2
        distance = np.abs(offsets)
        # float32, as DeBERTa computes it, so the bucket edges fall where its own do
        far = (
            np.ceil(
                np.log(np.maximum(distance, mid).astype(np.float32) / np.float32(mid))
                / np.log(np.float32((d.max_relative - 1) / mid))
                * np.float32(mid - 1)
            ).astype(np.int64)
            + mid
        )
        offsets = np.where(distance <= mid, offsets, far * np.sign(offsets))
    return mx.array(np.clip(offsets + d.span, 0, 2 * d.span - 1).astype(np.int32))


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig, d: Disentangled) -> None:
        super().__init__()
        size = c.embedding_size or c.hidden_size
        self.word = nn.Embedding(c.vocab_size, size)
        if d.position_biased_input:
            self.position = nn.Embedding(c.max_positions, size)
        if c.type_vocab_size > 0:
            self.token_type = nn.Embedding(c.type_vocab_size, size)
        if size != c.hidden_size:
            self.project = nn.Linear(size, c.hidden_size, bias=False)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, ids: mx.array, positions: mx.array, types: mx.array) -> mx.array:
        rows = self.word(ids)
        if "position" in self:
            rows = rows + self.position(positions)
        if "token_type" in self:
            rows = rows + self.token_type(types)
        return self.norm(self.project(rows) if "project" in self else rows)


class Layer(bert.Block):
    """BERT's layer whose scores add DeBERTa's disentangled relative terms."""

    def __init__(self, c: EncoderConfig, d: Disentangled) -> None:
        super().__init__(c)
        h = c.hidden_size
        self.d = d
        self.scale = 1.0 / math.sqrt(h // c.num_heads * (1 + d.c2p + d.p2c))
        if not d.share_keys:
            if d.c2p:
                self.pos_key = nn.Linear(h, h)
            if d.p2c:
                self.pos_query = nn.Linear(h, h)

    def __call__(
        self, x: mx.array, layout: VarlenLayout, relative: mx.array, index: list[mx.array]
    ) -> mx.array:
        """``relative``: the relative embeddings [2 * span, hidden]; ``index``: each attention
        group's ``relative_index``."""

        def heads(t: mx.array) -> mx.array:  # [N, hidden] -> [H, N, D]
            return t.reshape(t.shape[0], self.heads, -1).transpose(1, 0, 2)

        shared = self.d.share_keys
        pos_key = heads((self.key if shared else self.pos_key)(relative)) if self.d.c2p else None
        pos_query = (
            heads((self.query if shared else self.pos_query)(relative)) if self.d.p2c else None
        )

        def bias(n: int, q: mx.array, k: mx.array) -> mx.array:
            """[B, H, L, L] (q_i . pos_key[index[i, j]] + k_j . pos_query[index[i, j]]) * scale."""
            b, h, length, _ = q.shape
            where = mx.broadcast_to(index[n], (b, h, length, length))
            total = mx.zeros((b, h, length, length), q.dtype)
            if pos_key is not None:
                total = total + mx.take_along_axis(q @ pos_key.swapaxes(1, 2), where, axis=-1)
            if pos_query is not None:
                by_key = k @ pos_query.swapaxes(1, 2)  # [B, H, L (keys), 2 * span]
                by_key = mx.take_along_axis(by_key, where.swapaxes(2, 3), axis=-1)
                total = total + by_key.swapaxes(2, 3)
            return total * self.scale

        return self.attend(x, layout, bias)


class Deberta(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        assert c.disentangled is not None
        self.config, d = c, c.disentangled
        self.embeddings = Embeddings(c, d)
        self.layers = [Layer(c, d) for _ in range(c.num_layers)]
        self.relative = nn.Embedding(2 * d.span, c.hidden_size)
        if d.norm:
            self.relative_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(
        self, ids: mx.array, positions: mx.array, types: mx.array, layout: VarlenLayout
    ) -> mx.array:
        """The last layer's hidden states of the packed rows, [T, hidden]."""
        assert self.config.disentangled is not None
        x = self.embeddings(ids, positions, types)
        relative = self.relative.weight
        if "relative_norm" in self:
            relative = self.relative_norm(relative)
        index = [relative_index(g.length, self.config.disentangled) for g in layout.groups]
        for layer in self.layers:
            x = layer(x, layout, relative, index)
        return x


# HF name (``deberta.`` stripped) -> ours; the MLM heads are dropped
_DEBERTA = (
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.position_embeddings\.", "embeddings.position."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
    (r"^embeddings\.embed_proj\.", "embeddings.project."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.rel_embeddings\.", "relative."),
    (r"^encoder\.LayerNorm\.", "relative_norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)_proj\.", r"layers.\1.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.pos_key_proj\.", r"layers.\1.pos_key."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.pos_query_proj\.", r"layers.\1.pos_query."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attn_out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attn_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.up."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.down."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.out_norm."),
)


def deberta_weights(weights: dict[str, mx.array], config: EncoderConfig) -> dict[str, mx.array]:
    return renamed(weights, config.layout.prefix, _DEBERTA)
