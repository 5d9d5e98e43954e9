"""The BERT / RoBERTa / XLM-RoBERTa encoder in MLX over packed rows (macbatch's own code, from
the architecture: post-LayerNorm blocks, learned absolute positions and token types), with
ELECTRA's narrower embeddings projected up to the hidden size, and MPNet's relative-position
attention bias (``relative.py``), shared by every layer. Every family's classification head is
``classifier.py``'s."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.encoder.relative import relative_buckets
from macbatch.engine.encoder.varlen import ScoreBias, VarlenLayout, varlen_attention

_ACTIVATIONS = {
    "gelu": nn.gelu,  # the exact (erf) GELU
    "gelu_new": nn.gelu_approx,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "relu": nn.relu,
    "silu": nn.silu,
    "tanh": mx.tanh,
}


def activation(name: str) -> nn.Module | object:
    if name not in _ACTIVATIONS:
        raise ValueError(f"hidden_act '{name}' is not one macbatch's encoder runs")
    return _ACTIVATIONS[name]


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        size = c.embedding_size or c.hidden_size
        self.word = nn.Embedding(c.vocab_size, size)
        self.position = nn.Embedding(c.max_positions, size)
        if c.type_vocab_size > 0:
            self.token_type = nn.Embedding(c.type_vocab_size, size)
        self.norm = nn.LayerNorm(size, eps=c.layer_norm_eps)
        if size != c.hidden_size:  # ELECTRA's ``embeddings_project``
            self.project = nn.Linear(size, c.hidden_size)

    def __call__(self, ids: mx.array, positions: mx.array, types: mx.array) -> mx.array:
        rows = self.word(ids) + self.position(positions)
        if "token_type" in self:
            rows = rows + self.token_type(types)
        rows = self.norm(rows)
        return self.project(rows) if "project" in self else rows


class Block(nn.Module):
    """A post-norm encoder layer (BERT's shape): ``attend`` runs it, under any score bias."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.heads = c.num_heads
        self.scale = 1.0 / math.sqrt(h // c.num_heads)
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.up = nn.Linear(h, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.act = activation(c.hidden_act)

    def attend(self, x: mx.array, layout: VarlenLayout, score_bias: ScoreBias | None) -> mx.array:
        """Post-norm attention then MLP over the packed rows ``x``, the scores of each attention
        group plus ``score_bias`` (its group index, queries, keys) where one is given."""
        rows = x.shape[0]
        q, k, v = (
            t.reshape(rows, self.heads, -1) for t in (self.query(x), self.key(x), self.value(x))
        )
        attended = varlen_attention(q, k, v, layout, self.scale, score_bias=score_bias)
        x = self.attn_norm(x + self.attn_out(attended))
        return self.out_norm(x + self.down(self.act(self.up(x))))  # type: ignore[operator]


class Layer(Block):
    def __call__(
        self, x: mx.array, layout: VarlenLayout, biases: list[mx.array] | None = None
    ) -> mx.array:
        """``biases``: each attention group's score bias (MPNet's relative positions)."""
        return self.attend(x, layout, None if biases is None else lambda n, _q, _k: biases[n])


class Encoder(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.config = c
        self.embeddings = Embeddings(c)
        self.layers = [Layer(c) for _ in range(c.num_layers)]
        if c.relative_buckets:
            self.relative_bias = nn.Embedding(c.relative_buckets, c.num_heads)

    def __call__(
        self, ids: mx.array, positions: mx.array, types: mx.array, layout: VarlenLayout
    ) -> mx.array:
        """The last layer's hidden states of the packed rows, [T, hidden]."""
        x = self.embeddings(ids, positions, types)
        biases = None
        if "relative_bias" in self:  # [H, L, L] per attention group, for every layer
            biases = [
                self.relative_bias(
                    relative_buckets(g.length, self.config.relative_buckets)
                ).transpose(2, 0, 1)
                for g in layout.groups
            ]
        for layer in self.layers:
            x = layer(x, layout, biases)
        return x
