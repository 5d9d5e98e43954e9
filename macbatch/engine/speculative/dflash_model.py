"""The DFlash drafter (block diffusion, z-lab's ``*-DFlash-b16`` checkpoints) as a module of our
own, in the layout those checkpoints store (mlx-vlm 0.7.10's ``qwen3_dflash`` reads the same).

A few Qwen3 decoder layers read the target's hidden states at several of its layers
(``target_layer_ids``: the outputs of those decoder layers, concatenated in that order), fused by
``fc`` and ``hidden_norm`` into one context feature per position. Every layer's context K/V is
its own ``k_proj`` / ``v_proj`` of that one feature (no input norm; keys through ``k_norm`` and
RoPE at the context's positions). A block is the last known token then ``block_size - 1`` mask
tokens (``mask_token_id``) at the next positions, embedded by the target's embedding; its rows
attend to the whole context and to each other both ways, and the target's LM head over rows 1..
of the block proposes the whole block at once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from macbatch.engine.speculative.drafter_checkpoint import (
    input_width,
    load_into,
    read_checkpoint,
)


@dataclass
class DFlashConfig:
    """The fields a DFlash checkpoint's ``config.json`` declares (its ``dflash_config`` section
    holds the mask token and the target's layers)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 40960
    layer_types: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DFlashConfig:
        flat = dict(raw)
        flat.update(flat.pop("dflash_config", None) or {})
        rope = flat.pop("rope_parameters", None)
        if isinstance(rope, Mapping):  # newer transformers nest the base here
            rope = dict(rope)
            flat.setdefault("rope_theta", rope.pop("rope_theta", 1_000_000.0))
            flat["rope_scaling"] = rope or None
        flat.setdefault("head_dim", flat["hidden_size"] // flat["num_attention_heads"])
        known = cls.__dataclass_fields__
        config = cls(**{k: v for k, v in flat.items() if k in known})
        if any(t != "full_attention" for t in config.layer_types):
            raise ValueError("a DFlash drafter with sliding-window layers is not supported")
        return config


def is_dflash_config(raw: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's config is a DFlash drafter's (its ``dflash_config``, or the
    fields it flattens to)."""
    architectures = " ".join(raw.get("architectures") or ())
    return (
        "dflash_config" in raw
        or "DFlash" in architectures
        or ("target_layer_ids" in raw and "mask_token_id" in raw)
    )


def drafter_rope(config: Any) -> nn.Module:
    """A drafter layer's RoPE (``config``: its head size, base, scaling and context; DFlash's,
    Eagle-3's), as mlx-lm builds a model's (llama3 and YaRN scaling included)."""
    return initialize_rope(
        config.head_dim,
        config.rope_theta,
        False,
        config.rope_scaling,
        config.max_position_embeddings,
    )


def add_projections(attention: nn.Module, config: Any, inputs: int, bias: bool = False) -> None:
    """Give ``attention`` a drafter layer's ``q_proj`` / ``k_proj`` / ``v_proj`` from ``inputs``
    features and its ``o_proj`` back to the hidden size, with the head counts and the scale
    (``config``: its hidden size, heads, KV heads and head size; DFlash's, Eagle-3's)."""
    heads, kv_heads, head_dim = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    attention.num_heads, attention.num_kv_heads = heads, kv_heads
    attention.scale = head_dim**-0.5
    attention.q_proj = nn.Linear(inputs, heads * head_dim, bias=bias)
    attention.k_proj = nn.Linear(inputs, kv_heads * head_dim, bias=bias)
    attention.v_proj = nn.Linear(inputs, kv_heads * head_dim, bias=bias)
    attention.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=bias)


class _Attention(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        head_dim = config.head_dim
        add_projections(self, config, config.hidden_size)
        self.q_norm = nn.RMSNorm(head_dim, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=config.rms_norm_eps)

    def keys_values(self, x: mx.array, rope: Any, positions: mx.array) -> tuple[mx.array, ...]:
        """K and V ``[N, kv_heads, 1, D]`` of rows ``[N, 1, dim]`` at ``positions [N]``."""
        n = x.shape[0]
        keys = self.k_norm(self.k_proj(x).reshape(n, 1, self.num_kv_heads, -1))
        values = self.v_proj(x).reshape(n, 1, self.num_kv_heads, -1)
        keys = rope(keys.transpose(0, 2, 1, 3), offset=positions)
        return keys, values.transpose(0, 2, 1, 3)

    def __call__(self, x: mx.array, rope: Any, cache: Any) -> mx.array:
        """A block's rows ``[N, 1, dim]``: their K/V written to ``cache``'s pages, then its
        paged attention (context causally, the block both ways: the batch's blocks)."""
        n = x.shape[0]
        queries = self.q_norm(self.q_proj(x).reshape(n, 1, self.num_heads, -1))
        queries = rope(queries.transpose(0, 2, 1, 3), offset=cache.offset)
        keys, values = cache.update_and_fetch(*self.keys_values(x, rope, cache.offset))
        out = cache.attend(queries, keys, values, self.scale, None, None)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(n, 1, -1))


class MLP(nn.Module):
    """A Llama / Qwen3 gated MLP (the Eagle-3 drafter's too)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, rope: Any, cache: Any) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), rope, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashModel(nn.Module):
    """The drafter's weights: ``fc`` (all target layers' features to one), ``hidden_norm``, the
    decoder ``layers`` and the final ``norm``; ``embed_tokens`` only where the checkpoint has
    one (else the target's). The LM head is always the target's."""

    def __init__(self, config: DFlashConfig, target_hidden: int | None = None) -> None:
        super().__init__()
        self.config = config
        width = len(config.target_layer_ids) * (target_hidden or config.hidden_size)
        self.fc = nn.Linear(width, config.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = [_Layer(config) for _ in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rope = drafter_rope(config)

    def context(self, features: mx.array) -> mx.array:
        """The context feature ``[N, 1, dim]`` of the target's concatenated layer outputs."""
        return self.hidden_norm(self.fc(features))

    def __call__(self, embeddings: mx.array, caches: list[Any]) -> mx.array:
        """The normed output rows of a packed set of blocks (``caches``: one paged cache per
        layer, over the blocks' positions)."""
        h = embeddings
        for layer, cache in zip(self.layers, caches):
            h = layer(h, self.rope, cache)
        return self.norm(h)


def load_dflash(path: str | Path) -> DFlashModel:
    """A DFlash checkpoint from a local directory or a hub id, its weights as stored (the
    ``model.`` prefix some keep dropped; a quantized one is quantized as its config says)."""
    raw, weights = read_checkpoint(path, "DFlash")
    config = DFlashConfig.from_dict(raw)
    target_hidden = input_width(weights, "fc", raw) // len(config.target_layer_ids)
    return load_into(DFlashModel(config, target_hidden), weights, raw)


def describe_dflash(raw: Mapping[str, Any]) -> str:
    """What ``macbatch doctor`` says of a DFlash checkpoint (its config ``raw``): what drafts
    with it, and how."""
    config = DFlashConfig.from_dict(raw)
    return (
        f"DFlash (block diffusion): {config.num_hidden_layers} layer(s), blocks of "
        f"{config.block_size} (up to {config.block_size - 1} drafts a step), reading target "
        f"layers {config.target_layer_ids}; --draft-model PATH beside its target drafts with it "
        "(--speculative auto or dflash; docs/speculative.md)"
    )
