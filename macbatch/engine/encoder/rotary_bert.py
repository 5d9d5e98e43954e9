"""gte (Alibaba's ``NewModel``) and Nomic BERT in MLX over packed rows (macbatch's own code, from
the architecture): BERT's post-LayerNorm block with rotary positions in place of a position
table, one packed QKV projection and a gated MLP (``act(gate(x)) * up(x)``). gte keeps its
attention and output biases; Nomic BERT has none."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.encoder.bert import activation
from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.encoder.rotary import Rotation, inverse_frequencies
from macbatch.engine.encoder.varlen import VarlenLayout, varlen_attention
from macbatch.engine.encoder.weights import renamed
from macbatch.engine.model.families import EncoderNaming

# Nomic names its gated activation after the pair: SwiGLU is SiLU's gate
_GATED_ACTIVATIONS = {"swiglu": "silu"}


class Embeddings(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        if c.type_vocab_size > 0:
            self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, ids: mx.array, types: mx.array) -> mx.array:
        rows = self.word(ids)
        if "token_type" in self:
            rows = rows + self.token_type(types)
        return self.norm(rows)


class Layer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        h, inter = c.hidden_size, c.intermediate_size
        self.heads = c.num_heads
        self.scale = 1.0 / math.sqrt(h // c.num_heads)
        self.qkv = nn.Linear(h, 3 * h, bias=c.attention_bias)
        self.attn_out = nn.Linear(h, h, bias=c.attention_bias)
        self.attn_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.up = nn.Linear(h, inter, bias=c.mlp_in_bias)
        self.gate = nn.Linear(h, inter, bias=c.mlp_in_bias)
        self.down = nn.Linear(inter, h, bias=c.mlp_out_bias)
        self.out_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.act = activation(_GATED_ACTIVATIONS.get(c.hidden_act, c.hidden_act))

    def __call__(self, x: mx.array, layout: VarlenLayout, rotation: Rotation) -> mx.array:
        q, k, v = self.qkv(x).reshape(x.shape[0], 3, self.heads, -1).transpose(1, 0, 2, 3)
        attended = varlen_attention(rotation(q), rotation(k), v, layout, self.scale)
        x = self.attn_norm(x + self.attn_out(attended))
        gated = self.act(self.gate(x)) * self.up(x)  # type: ignore[operator]
        return self.out_norm(x + self.down(gated))


class RotaryEncoder(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        assert c.rope_theta is not None
        self.config = c
        self.embeddings = Embeddings(c)
        self.layers = [Layer(c) for _ in range(c.num_layers)]
        self.inverse = inverse_frequencies(c.hidden_size // c.num_heads, c.rope_theta,
                                           c.rope_ntk_factor)  # fmt: skip

    def __call__(
        self, ids: mx.array, positions: mx.array, types: mx.array, layout: VarlenLayout
    ) -> mx.array:
        """The last layer's hidden states of the packed rows, [T, hidden]."""
        x = self.embeddings(ids, types)
        rotation = Rotation.build(positions, self.inverse)
        for layer in self.layers:
            x = layer(x, layout, rotation)
        return x


# HF name (prefix stripped) -> ours, as each family's published checkpoints name them
_COMMON = (
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
)
_GTE = _COMMON + (
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.qkv_proj\.", r"layers.\1.qkv."),
    (r"^encoder\.layer\.(\d+)\.attention\.o_proj\.", r"layers.\1.attn_out."),
    (r"^encoder\.layer\.(\d+)\.attn_ln\.", r"layers.\1.attn_norm."),
    (r"^encoder\.layer\.(\d+)\.mlp\.up_gate_proj\.", r"layers.\1.up_gate."),  # [up; gate]
    (r"^encoder\.layer\.(\d+)\.mlp\.down_proj\.", r"layers.\1.down."),
    (r"^encoder\.layer\.(\d+)\.mlp_ln\.", r"layers.\1.out_norm."),
)
_NOMIC = _COMMON + (
    (r"^emb_ln\.", "embeddings.norm."),
    (r"^encoder\.layers\.(\d+)\.attn\.Wqkv\.", r"layers.\1.qkv."),
    (r"^encoder\.layers\.(\d+)\.attn\.out_proj\.", r"layers.\1.attn_out."),
    (r"^encoder\.layers\.(\d+)\.mlp\.fc11\.", r"layers.\1.up."),
    (r"^encoder\.layers\.(\d+)\.mlp\.fc12\.", r"layers.\1.gate."),
    (r"^encoder\.layers\.(\d+)\.mlp\.fc2\.", r"layers.\1.down."),
    (r"^encoder\.layers\.(\d+)\.norm1\.", r"layers.\1.attn_norm."),
    (r"^encoder\.layers\.(\d+)\.norm2\.", r"layers.\1.out_norm."),
)


def rotary_weights(weights: dict[str, mx.array], config: EncoderConfig) -> dict[str, mx.array]:
    """Our names for a gte or Nomic BERT checkpoint's weights; gte's packed ``up_gate_proj``
    (its up rows first) split into ``up`` and ``gate``."""
    table = _GTE if config.layout.naming is EncoderNaming.GTE else _NOMIC
    out = renamed(weights, config.layout.prefix, table)
    for name in [n for n in out if ".up_gate." in n]:
        up, gate = mx.split(out.pop(name), 2, axis=0)
        out[name.replace(".up_gate.", ".up.")] = up
        out[name.replace(".up_gate.", ".gate.")] = gate
    return out
