"""The DFlash drafter (block diffusion, z-lab's ``*-DFlash-b16`` checkpoints) as a module of our
own, in the layout those checkpoints store (mlx-vlm 0.7.10's ``qwen3_dflash`` reads the same).

A few Qwen3 decoder layers read the target's hidden states at several of its layers
(``target_layer_ids``: the outputs of those decoder layers, concatenated in that order), fused by
``fc`` and ``hidden_norm`` into one context feature per position. Every layer's context K/V is
its own ``k_proj`` / ``v_proj`` of that one feature (no input norm; keys through ``k_norm`` and
RoPE at the context's positions). A block is the last known token then ``block_size - 1`` mask
tokens (``mask_token_id``) at the next positions, embedded by the target's embedding; its rows
attend to the whole context and to each other both ways, and the target's LM head over rows 1..
of the block proposes the whole block at once.

DFlash2 and DSpark checkpoints (z-lab's later formats, as mlx-vlm 0.7.10's ``dflash2`` and
``dspark`` read them) are the same drafter with more: DFlash2's convolutions around each
sublayer and its candidate selector, DSpark's Markov head (dflash_variants.py); ``variant``
says which."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from macbatch.engine.speculative.dflash_variants import BlockConv, CandidateSelector, MarkovHead
from macbatch.engine.speculative.drafter_checkpoint import (
    input_width,
    load_into,
    read_checkpoint,
)


@dataclass
class DFlashConfig:
    """The fields a DFlash checkpoint's ``config.json`` declares (its ``dflash_config`` section
    holds the mask token and the target's layers, and a DFlash2 one its convolutions' and
    selector's sizes and its scales)."""

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
    sliding_window: int | None = None  # the context a sliding layer's rows see (with their own)
    variant: str = "dflash"  # or "dflash2", "dspark"
    vocab_size: int = 0
    runtime_block_size: int | None = None  # the widest block it drafts (default: block_size)
    causal: bool = False
    rope_is_neox_style: bool = True
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    conv_kernel_size: int = 0  # DFlash2's convolutions (0: none)
    conv_group_size: int = 0
    selector_rank: int = 0  # DFlash2's candidate selector
    selector_top_k: int = 0
    markov_rank: int = 0  # DSpark's Markov head
    sample_from_anchor: bool = False  # DSpark's: the known token's row drafts the first token

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DFlashConfig:
        flat = dict(raw)
        flat.update(flat.pop("dflash_config", None) or {})
        if "causal" not in flat and "dflash_query_causal" in flat:  # an older name, as mlx-vlm
            flat["causal"] = flat.pop("dflash_query_causal")
        _variant_fields(flat, raw.get("architectures") or ())
        rope = flat.pop("rope_parameters", None)
        if isinstance(rope, Mapping):  # newer transformers nest the base here
            rope = dict(rope)
            flat.setdefault("rope_theta", rope.pop("rope_theta", 1_000_000.0))
            flat["rope_scaling"] = rope or None
        flat.setdefault("head_dim", flat["hidden_size"] // flat["num_attention_heads"])
        known = cls.__dataclass_fields__
        config = cls(**{k: v for k, v in flat.items() if k in known})
        config.causal = bool(config.causal)
        _check_attention(config)
        return config

    @property
    def windows(self) -> list[int | None]:
        """Each layer's window (None: a full-attention layer): a sliding layer's rows see the
        last ``sliding_window - 1`` context positions before their block (with causal blocks,
        the last ``sliding_window`` positions up to their own, block rows included)."""
        types = self.layer_types or ["full_attention"] * self.num_hidden_layers
        return [self.sliding_window if t == "sliding_attention" else None for t in types]

    @property
    def max_drafts(self) -> int:
        """The most drafts of one block: its widest verification, less the known token."""
        return min(self.block_size, self.runtime_block_size or self.block_size) - 1

    @property
    def first_draft_row(self) -> int:
        """The row of a block whose output is its first draft: the known token's (DSpark's,
        its block one mask shorter), else the first mask's."""
        return 0 if self.sample_from_anchor else 1


def _check_attention(config: DFlashConfig) -> None:
    """Refuse the layer types and blocks these classes do not build, as mlx-vlm 0.7.10 refuses
    them (DFlash2's causal blocks too: mlx-vlm refuses them, so no drafter holds them)."""
    types = config.layer_types
    if types and len(types) != config.num_hidden_layers:
        layers = config.num_hidden_layers
        raise ValueError(f"a DFlash drafter's layer_types must name its {layers} layers")
    unknown = set(types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ValueError(f"a DFlash drafter's layer type {sorted(unknown)} is not supported")
    if "sliding_attention" in types and not config.sliding_window:
        raise ValueError("a DFlash drafter with sliding-window layers needs a sliding_window")
    if config.causal and config.variant == "dflash2":
        raise ValueError(
            "a DFlash2 drafter with causal blocks is not supported (mlx-vlm 0.7.10 refuses it)"
        )


def _variant_fields(flat: dict[str, Any], architectures: Sequence[str]) -> None:
    """What a DFlash2 or a DSpark checkpoint's config means otherwise than DFlash's, as
    mlx-vlm 0.7.10 reads them, set in ``flat`` (its fields, ``dflash_config``'s merged in)."""
    if "Gemma4DSparkModel" in architectures:
        raise ValueError(
            "a Gemma 4 DSpark drafter (Gemma 4's own layers: per-layer-type RoPE, shared K/V) "
            "is not supported"
        )
    if "DFlash2DraftModel" in architectures:
        flat["variant"] = "dflash2"  # mlx-vlm's default width for it: 5
        flat.setdefault("runtime_block_size", min(5, int(flat.get("block_size", 16))))
    elif flat.get("projector_type") == "dspark" or int(flat.get("markov_rank") or 0) > 0:
        if flat.get("markov_head_type", "vanilla") != "vanilla":
            raise ValueError("a DSpark drafter's Markov head other than 'vanilla' is not supported")
        flat["variant"] = "dspark"
        if "swa_window_size" in flat:  # DSpark's name for its sliding layers' window
            flat["sliding_window"] = int(flat.pop("swa_window_size"))
        flat["markov_rank"] = int(flat.get("markov_rank") or 256)
        # its block_size counts the drafts; the verification adds the known token
        anchored = bool(flat.pop("dspark_bonus_anchor", False))
        flat["block_size"] = int(flat["block_size"]) + (0 if anchored else 1)
        flat.setdefault("runtime_block_size", min(8, flat["block_size"]))
        flat.setdefault("sample_from_anchor", True)


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
        not getattr(config, "rope_is_neox_style", True),  # MLX's "traditional": GPT-J pairs
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
    def __init__(self, config: DFlashConfig, window: int | None) -> None:
        super().__init__()
        head_dim = config.head_dim
        self.window = window
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
        paged attention (context causally, the block both ways unless blocks are causal: the
        batch's blocks; a sliding layer's within its window)."""
        n = x.shape[0]
        queries = self.q_norm(self.q_proj(x).reshape(n, 1, self.num_heads, -1))
        queries = rope(queries.transpose(0, 2, 1, 3), offset=cache.offset)
        keys, values = cache.update_and_fetch(*self.keys_values(x, rope, cache.offset))
        out = cache.attend(queries, keys, values, self.scale, self.window, None)
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
    def __init__(self, config: DFlashConfig, window: int | None) -> None:
        super().__init__()
        self.self_attn = _Attention(config, window)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, rope: Any, cache: Any, within: mx.array) -> mx.array:
        """A block's rows ``x`` (``within``: each row's index in its block, unused here)."""
        h = x + self.self_attn(self.input_layernorm(x), rope, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class _ConvLayer(_Layer):
    """DFlash2's layer: each sublayer's normed input and its output convolved along the block
    (dflash_variants.py)."""

    def __init__(self, config: DFlashConfig, window: int | None) -> None:
        super().__init__(config, window)
        sizes = (config.hidden_size, config.conv_kernel_size, config.conv_group_size)
        self.attention_conv = BlockConv(*sizes)
        self.mlp_conv = BlockConv(*sizes)

    def __call__(self, x: mx.array, rope: Any, cache: Any, within: mx.array) -> mx.array:
        h, kernel = self.attention_conv.prepare(self.input_layernorm(x), within)
        h = x + self.attention_conv.finish(self.self_attn(h, rope, cache), kernel, within)
        m, kernel = self.mlp_conv.prepare(self.post_attention_layernorm(h), within)
        return h + self.mlp_conv.finish(self.mlp(m), kernel, within)


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
        layer = _ConvLayer if config.conv_kernel_size else _Layer
        self.layers = [layer(config, window) for window in config.windows]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rope = drafter_rope(config)
        if config.selector_top_k:
            self.candidate_selector = CandidateSelector(
                config.vocab_size, config.hidden_size, config.selector_rank, config.selector_top_k
            )
        if config.variant == "dspark":
            self.markov_head = MarkovHead(config.vocab_size, config.markov_rank)

    def context(self, features: mx.array) -> mx.array:
        """The context feature ``[N, 1, dim]`` of the target's concatenated layer outputs."""
        return self.hidden_norm(self.fc(features))

    def __call__(self, embeddings: mx.array, caches: list[Any], within: mx.array) -> mx.array:
        """The normed output rows of a packed set of blocks (``caches``: one paged cache per
        layer, over the blocks' positions; ``within``: each row's index in its block)."""
        h = embeddings * self.config.input_embedding_scale
        for layer, cache in zip(self.layers, caches):
            h = layer(h, self.rope, cache, within)
        return self.norm(h)

    def choose(
        self, hidden: mx.array, logits: mx.array, anchors: mx.array, lengths: list[int]
    ) -> mx.array:
        """The drafts of blocks of ``lengths`` draft rows (``hidden [R, H]`` and the target's
        ``logits [R, V]`` at them; ``anchors``: each block's known token): the largest logit,
        or what DFlash2's selector or DSpark's Markov head chooses over the scaled, softcapped
        logits."""
        logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = mx.tanh(logits / cap) * cap
        if "candidate_selector" in self:
            return self.candidate_selector(hidden, logits, anchors, lengths)
        if "markov_head" in self:
            return self.markov_head(hidden, logits, anchors, lengths)
        return mx.argmax(logits, axis=-1)


def load_dflash(path: str | Path) -> DFlashModel:
    """A DFlash checkpoint from a local directory or a hub id, its weights as stored (the
    ``model.`` prefix some keep dropped; a quantized one is quantized as its config says)."""
    raw, weights = read_checkpoint(path, "DFlash")
    config = DFlashConfig.from_dict(raw)
    for name in ("predecessor_codebook", "successor_codebook"):  # DFlash2 stores them bare
        key = f"candidate_selector.{name}"
        if key in weights:
            weights[f"{key}.weight"] = weights.pop(key)
    # DSpark's confidence head: mlx-vlm loads it, and never calls it when drafting
    weights = {k: v for k, v in weights.items() if not k.startswith("confidence_head.")}
    target_hidden = input_width(weights, "fc", raw) // len(config.target_layer_ids)
    return load_into(DFlashModel(config, target_hidden), weights, raw)


def describe_dflash(raw: Mapping[str, Any]) -> str:
    """What ``macbatch doctor`` says of a DFlash checkpoint (its config ``raw``): what drafts
    with it, and how."""
    config = DFlashConfig.from_dict(raw)
    name = {"dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark"}[config.variant]
    return (
        f"{name} (block diffusion): {config.num_hidden_layers} layer(s), blocks of "
        f"{config.block_size} (up to {config.max_drafts} drafts a step), reading target "
        f"layers {config.target_layer_ids}; --draft-model PATH beside its target drafts with it "
        "(--speculative auto or dflash; docs/speculative.md)"
    )
