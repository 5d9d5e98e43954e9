"""ModernBERT in MLX over packed rows (macbatch's own code, from the architecture): pre-LayerNorm
blocks (the first without its attention norm) and a final norm, no biases by default, rotary
positions under two bases, a GeGLU MLP (``act(input) * gate`` from one packed projection), and
local layers whose rows see only the keys within half of ``local_attention`` of them, between
global layers every ``global_attn_every_n_layers``."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.encoder.bert import activation
from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.encoder.rotary import Rotation, inverse_frequencies
from macbatch.engine.encoder.varlen import VarlenLayout, varlen_attention
from macbatch.engine.encoder.weights import renamed


def _norm(c: EncoderConfig) -> nn.LayerNorm:
    return nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias)


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.norm = _norm(c)

    def __call__(self, ids: mx.array) -> mx.array:
        return self.norm(self.word(ids))


class Layer(nn.Module):
    def __init__(self, c: EncoderConfig, index: int) -> None:
        super().__init__()
        h, inter = c.hidden_size, c.intermediate_size
        self.heads = c.num_heads
        self.scale = 1.0 / math.sqrt(h // c.num_heads)
        self.window = c.windows[index]
        if index > 0:  # the embeddings' norm stands in for the first layer's
            self.attn_norm = _norm(c)
        self.qkv = nn.Linear(h, 3 * h, bias=c.attention_bias)
        self.attn_out = nn.Linear(h, h, bias=c.attention_bias)
        self.mlp_norm = _norm(c)
        self.up_gate = nn.Linear(h, 2 * inter, bias=c.mlp_in_bias)  # [input; gate]
        self.down = nn.Linear(inter, h, bias=c.mlp_out_bias)
        self.act = activation(c.hidden_act)

    def __call__(self, x: mx.array, layout: VarlenLayout, rotation: Rotation) -> mx.array:
        normed = self.attn_norm(x) if "attn_norm" in self else x
        q, k, v = self.qkv(normed).reshape(x.shape[0], 3, self.heads, -1).transpose(1, 0, 2, 3)
        x = x + self.attn_out(
            varlen_attention(rotation(q), rotation(k), v, layout, self.scale, self.window)
        )
        up, gate = mx.split(self.up_gate(self.mlp_norm(x)), 2, axis=-1)
        return x + self.down(self.act(up) * gate)  # type: ignore[operator]


class ModernBert(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        assert c.rope_theta is not None and c.local_rope_theta is not None
        self.config = c
        self.embeddings = Embeddings(c)
        self.layers = [Layer(c, n) for n in range(c.num_layers)]
        self.final_norm = _norm(c)
        dim = c.hidden_size // c.num_heads
        self.inverse_global = inverse_frequencies(dim, c.rope_theta)
        self.inverse_local = inverse_frequencies(dim, c.local_rope_theta)

    def __call__(
        self, ids: mx.array, positions: mx.array, types: mx.array, layout: VarlenLayout
    ) -> mx.array:
        """The last layer's hidden states of the packed rows after the final norm, [T, hidden]
        (``types``: ModernBERT has none)."""
        x = self.embeddings(ids)
        rotations = {
            False: Rotation.build(positions, self.inverse_global),
            True: Rotation.build(positions, self.inverse_local),
        }
        for layer in self.layers:
            x = layer(x, layout, rotations[layer.window is not None])
        return self.final_norm(x)


# HF name (``model.`` stripped) -> ours; the MLM head (``head.``, ``decoder.``) is dropped
_MODERNBERT = (
    (r"^embeddings\.tok_embeddings\.", "embeddings.word."),
    (r"^embeddings\.norm\.", "embeddings.norm."),
    (r"^layers\.(\d+)\.attn_norm\.", r"layers.\1.attn_norm."),
    (r"^layers\.(\d+)\.attn\.Wqkv\.", r"layers.\1.qkv."),
    (r"^layers\.(\d+)\.attn\.Wo\.", r"layers.\1.attn_out."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"layers.\1.mlp_norm."),
    (r"^layers\.(\d+)\.mlp\.Wi\.", r"layers.\1.up_gate."),
    (r"^layers\.(\d+)\.mlp\.Wo\.", r"layers.\1.down."),
    (r"^final_norm\.", "final_norm."),
)


def modernbert_weights(weights: dict[str, mx.array], config: EncoderConfig) -> dict[str, mx.array]:
    return renamed(weights, config.layout.prefix, _MODERNBERT)
