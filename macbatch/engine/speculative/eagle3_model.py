"""The Eagle-3 drafter (one decoder layer over fused low/mid/high target features) as a module of
our own, in the layout SGLang / SpecForge checkpoints store (``LlamaForCausalLMEagle3``, such as
``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``; the facts as SGLang's ``llama_eagle3`` and mlx-vlm
0.7.10's ``eagle3`` drafter read them).

``fc`` fuses the target's hidden states at three of its layers (concatenated low, mid, high)
into one feature per position. The one layer (``midlayer``) reads, at position ``t``, the
embedding of token ``t + 1`` (``input_layernorm``) beside the feature at ``t`` (``hidden_norm``),
concatenated into its attention's ``2 * hidden`` inputs; the feature (not normed) is the
residual; then a Llama MLP. Its output, through ``norm`` and its own ``lm_head`` over a smaller
draft vocabulary, predicts token ``t + 2``; ``d2t`` maps a draft id ``i`` to the target's
``i + d2t[i]``. The layer's output before ``norm`` is the feature the next draft reads in place
of the target's (the target has not run there yet), as MTP's does (mtp.py).

Which target layers: ``eagle_config.eagle_aux_hidden_state_layer_ids`` where the config has them,
read as SGLang reads them (the outputs of those decoder layers, 0-based); else EAGLE's own
default, the inputs of layers 2, N/2 and N-3 (the outputs of layers 1, N/2-1 and N-4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.speculative.dflash_model import MLP, add_projections, drafter_rope
from macbatch.engine.speculative.drafter_checkpoint import (
    input_width,
    load_into,
    read_checkpoint,
)


@dataclass
class Eagle3Config:
    """The fields an Eagle-3 checkpoint's ``config.json`` declares (Llama's, with
    ``draft_vocab_size`` and an ``eagle_config``), flattened."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: list[int] | None = None  # None: EAGLE's default for the target's depth
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    attention_bias: bool = False

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Eagle3Config:
        flat = dict(raw)
        eagle = flat.pop("eagle_config", None) or {}
        flat["aux_layer_ids"] = eagle.get("eagle_aux_hidden_state_layer_ids")
        flat.setdefault("head_dim", flat["hidden_size"] // flat["num_attention_heads"])
        flat.setdefault("draft_vocab_size", flat["vocab_size"])
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in flat.items() if k in known})

    def target_layers(self, num_layers: int) -> list[int]:
        """The target's decoder layers (0-based) whose outputs ``fc`` fuses, low to high."""
        if self.aux_layer_ids is not None:
            return [int(i) for i in self.aux_layer_ids]
        return [max(i - 1, 0) for i in (2, num_layers // 2, num_layers - 3)]


def is_eagle3_config(raw: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's config is an Eagle-3 drafter's."""
    architectures = " ".join(raw.get("architectures") or ())
    return "Eagle3" in architectures or "eagle_config" in raw


class _Attention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        # the token's embedding and the feature, side by side
        add_projections(self, config, 2 * config.hidden_size, config.attention_bias)

    def __call__(self, x: mx.array, rope: Any, cache: Any) -> mx.array:
        """Rows ``[N, 1, 2*dim]``: their K/V written to ``cache``'s pages at its positions, then
        the paged (causal) attention over each row's sequence."""
        n = x.shape[0]
        queries, keys, values = (
            proj(x).reshape(n, 1, heads, -1).transpose(0, 2, 1, 3)
            for proj, heads in (
                (self.q_proj, self.num_heads),
                (self.k_proj, self.num_kv_heads),
                (self.v_proj, self.num_kv_heads),
            )
        )
        queries = rope(queries, offset=cache.offset)
        keys, values = cache.update_and_fetch(rope(keys, offset=cache.offset), values)
        out = cache.attend(queries, keys, values, self.scale, None, None)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(n, 1, -1))


class _MidLayer(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(dim, eps=eps)
        self.hidden_norm = nn.RMSNorm(dim, eps=eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(dim, eps=eps)
        self.mlp = MLP(dim, config.intermediate_size)

    def __call__(self, embeddings: mx.array, hidden: mx.array, rope: Any, cache: Any) -> mx.array:
        both = [self.input_layernorm(embeddings), self.hidden_norm(hidden)]
        h = hidden + self.self_attn(mx.concatenate(both, axis=-1), rope, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Model(nn.Module):
    """The drafter's weights as the checkpoint names them: ``fc``, ``midlayer``, ``norm``,
    ``lm_head`` (draft vocabulary) and ``d2t``; ``embed_tokens`` only where the checkpoint has
    one (else the target's)."""

    def __init__(self, config: Eagle3Config, target_hidden: int, num_features: int = 3) -> None:
        super().__init__()
        self.config = config
        dim = config.hidden_size
        self.fc = nn.Linear(num_features * target_hidden, dim, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = nn.RMSNorm(dim, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(dim, config.draft_vocab_size, bias=False)
        self.d2t = mx.zeros((config.draft_vocab_size,), dtype=mx.int32)
        self.rope = drafter_rope(config)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: Any) -> mx.array:
        """The layer's output ``[N, 1, dim]`` (before ``norm``: the next draft's feature) for
        rows of next-token embeddings and the features before them."""
        return self.midlayer(embeddings, hidden, self.rope, cache)

    def draft_tokens(self, out: mx.array) -> mx.array:
        """The target's ids ``[N]`` of the greedy drafts of output rows ``[N, 1, dim]``."""
        ids = mx.argmax(self.lm_head(self.norm(out))[:, -1, :], axis=-1)
        return ids + self.d2t[ids]


def load_eagle3(path: str | Path) -> Eagle3Model:
    """An Eagle-3 checkpoint from a local directory or a hub id (drafter_checkpoint.py; ``t2d``,
    the reverse map, unused)."""
    raw, weights = read_checkpoint(path, "Eagle-3")
    config = Eagle3Config.from_dict(raw)
    weights.pop("t2d", None)
    num_features = len(config.aux_layer_ids or (0, 0, 0))
    model = Eagle3Model(config, input_width(weights, "fc", raw) // num_features, num_features)
    weights["d2t"] = weights.get("d2t", model.d2t).astype(mx.int32)
    return load_into(model, weights, raw)


def describe_eagle3(raw: Mapping[str, Any]) -> str:
    """What ``macbatch doctor`` says of an Eagle-3 checkpoint (its config ``raw``)."""
    config = Eagle3Config.from_dict(raw)
    layers = config.aux_layer_ids or "EAGLE's default (inputs of 2, N/2, N-3)"
    return (
        f"Eagle-3: one layer over target layers {layers}, a draft vocabulary of "
        f"{config.draft_vocab_size}; --draft-model PATH beside its target drafts with it "
        "(--speculative auto or eagle3; docs/speculative.md)"
    )
