"""A tiny random Hunyuan V4 (mlx-vlm's ``hy_v4``) saved as an mlx-vlm conversion is (config.json,
the weights under its model's own names, the tiny byte-level tokenizer): DeepSeek V3.2's MLA
with a lightning indexer on its "full" layers only, "shared" layers reading the last full
layer's top-k, per-head attention sinks, a per-value output gate and four residual streams
(hyper-connections). Its top-12 selection drops positions of any longer context."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx

from tests.support.tiny import SPECIAL_TOKENS, VOCAB_SIZE, randomize, save_checkpoint

INDEX_TOPK = 12
CONFIG: dict[str, Any] = dict(
    model_type="hy_v4",
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    n_shared_experts=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    kv_lora_rank=32,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    index_head_dim=16,
    index_n_heads=4,
    index_topk=INDEX_TOPK,
    # two shared layers in a row (both read layer 0's selection), then a full one
    indexer_types=["full", "shared", "shared", "full"],
    max_position_embeddings=4096,
    rope_theta=10000.0,
)
# parameters mlx-vlm creates as zeros or ones (hyper-connection mixes, sinks): random here, so
# the test sees each of them act
_RANDOMIZED = ("hc_fn", "hc_base", "hc_scale", "hc_head_fn", "hc_head_base", "hc_head_scale",
               "learnable_sink_param")  # fmt: skip


def hy_v4_model(seed: int = 0, **overrides: Any) -> Any:
    """mlx-vlm's own Hunyuan V4 of ``CONFIG`` (float32, random weights)."""
    from mlx_vlm.models.hy_v4 import hy_v4

    mx.random.seed(seed)
    config = hy_v4.ModelConfig.from_dict({**copy.deepcopy(CONFIG), **overrides})
    model = hy_v4.Model(config)
    model.set_dtype(mx.float32)
    randomize(model, _RANDOMIZED, 0.5)
    return model


def save_hy_v4(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """The tiny checkpoint in ``path``; ``overrides`` merged into its config.json."""
    config = {**CONFIG, **overrides, "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>")}
    return save_checkpoint(path, hy_v4_model(seed, **overrides), config)


@contextmanager
def partition_per_call() -> Iterator[None]:
    """mlx-vlm's Hunyuan V4 indexer with its top-k partition evaluated afresh on each call.
    mlx-vlm 0.7.10 compiles it shapeless (``hy_v4/indexer.py``, ``_partition_scores``), which
    fixes ``argpartition``'s ``kth=-top_k`` at the first call's key count: every later call
    over more keys keeps the last ``top_k`` of a partition around the wrong rank (its own
    decode steps then disagree with its own one-pass forward of the same tokens)."""
    from mlx_vlm.models.hy_v4 import indexer

    def uncompiled(top_k: int, masked: bool) -> Any:
        def partition(q, k, weights, mask=None):
            per_head = mx.maximum(q @ k.swapaxes(-1, -2), 0)  # [B, H, L, T]
            scores = (per_head * weights.swapaxes(-1, -2)[..., None]).sum(axis=1, keepdims=True)
            if masked:
                scores = mx.where(mask, scores, -mx.inf)
            return mx.argpartition(scores, kth=scores.shape[-1] - top_k, axis=-1)

        return partition

    original = indexer._partition_scores
    indexer._partition_scores = uncompiled
    try:
        yield
    finally:
        indexer._partition_scores = original
