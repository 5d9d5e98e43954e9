"""Tiny random DeepSeek V4 pieces from both libraries, for the facts docs/engine.md states about
them ("What DeepSeek V4 ... needs"): which library's output a paged step could match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import deepseek_v41
from mlx_vlm.models.cache import PoolingCache
from mlx_vlm.models.deepseek_v4.config import ModelConfig
from mlx_vlm.models.deepseek_v4.language import Compressor

from tests.support.tiny import SPECIAL_TOKENS, VOCAB_SIZE, save_tokenizer

HIDDEN = 32


def _randomize(module: nn.Module, seed: int) -> None:
    mx.random.seed(seed)
    module.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.2, module.parameters()))


def tiny_v41(seed: int = 0) -> deepseek_v41.Model:
    """mlx-lm's V4.1 with a window of 8, ratio-4 compression on layers 1 to 3 (sources 1 and 3,
    layer 2 sharing layer 1's rows and top-k) and a top-3 selection: 48 tokens drop rows."""
    args = deepseek_v41.ModelArgs(
        vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=4, num_attention_heads=2,
        head_dim=32, q_lora_rank=16, qk_rope_head_dim=8, o_groups=2, o_lora_rank=8,
        moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, sliding_window=8,
        compress_ratios=(0, 4, 4, 4), kv_source_layer_ids=(1, 3),
        index_source_layer_ids=(1, 3), index_n_heads=2, index_head_dim=32, index_topk=3,
        hc_sinkhorn_iters=3, rms_norm_eps=1e-6,
    )  # fmt: skip
    model = deepseek_v41.Model(args)
    _randomize(model, seed)
    return model


def v41_logits(model: deepseek_v41.Model, tokens: mx.array, cuts: list[int]) -> mx.array:
    """The logits of ``tokens`` (``[1, T]``) prefilled in calls cut at ``cuts``."""
    cache = model.make_cache()
    bounds = [0, *cuts, tokens.shape[1]]
    parts = [model(tokens[:, a:b], cache) for a, b in zip(bounds, bounds[1:], strict=False)]
    return mx.concatenate(parts, axis=1)


def vlm_compressed_rows(
    ratio: int, tokens: int, cuts: list[int], seed: int = 0, cache_kind: type = PoolingCache
) -> mx.array:
    """mlx-vlm's compressed rows of ``tokens`` random hidden states fed in calls cut at
    ``cuts``, through a pooling cache of ``cache_kind`` (its own ``PoolingCache``, or one that
    takes its calls)."""
    config = ModelConfig(hidden_size=HIDDEN, num_hidden_layers=4, head_dim=16,
                         qk_rope_head_dim=8, q_lora_rank=16)  # fmt: skip
    compressor = Compressor(config, ratio, 16)
    _randomize(compressor, seed)
    x = mx.random.normal((1, tokens, HIDDEN), key=mx.random.key(seed + 1))
    cache = cache_kind(ratio)
    bounds = [0, *cuts, tokens]
    rows = None
    for a, b in zip(bounds, bounds[1:], strict=False):
        rows = compressor(x[:, a:b], cache, a)
    assert rows is not None
    return rows


def row_gaps(a: mx.array, b: mx.array) -> np.ndarray:
    """The largest absolute difference of each row (the last axis), in float64."""
    diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    return diff.max(axis=-1).reshape(-1)


# mlx-lm's V4.1 as a tiny checkpoint in the Hugging Face layout (config.json, the weights under
# mlx-lm's names, the tiny tokenizer), laid out as the released V4.1 is (window-only first
# layers, then ratio 2, then ratio 1; only some layers compress or index; a candidate filter):
# layer 1 compresses at ratio 2 and indexes, layer 2 compresses at ratio 1, indexes and picks
# 2 candidate blocks of 2 rows for layer 3, which indexes layer 2's keys among them. A window of
# 8 and a top-3 selection: a context past 8 tokens drops both window rows and compressed rows
V41_CONFIG: dict[str, Any] = dict(
    model_type="deepseek_v41", vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=4,
    num_attention_heads=2, head_dim=32, q_lora_rank=16, qk_rope_head_dim=8, o_groups=2,
    o_lora_rank=8, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
    sliding_window=8, compress_ratios=[0, 2, 1, 1], kv_source_layer_ids=[1, 2],
    index_source_layer_ids=[1, 2, 3], candidate_source_layer_id=2, candidate_topk_blocks=2,
    candidate_block_size=2, index_n_heads=2, index_head_dim=32, index_topk=3,
    hc_sinkhorn_iters=3, rms_norm_eps=1e-6,
)  # fmt: skip


def save_v41(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """The tiny V4.1 checkpoint in ``path`` (``overrides``: more config.json fields)."""
    config = {**V41_CONFIG, **overrides}
    model = deepseek_v41.Model(deepseek_v41.ModelArgs.from_dict(config))
    _randomize(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config["eos_token_id"] = SPECIAL_TOKENS.index("<|im_end|>")
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(path)
    return path
