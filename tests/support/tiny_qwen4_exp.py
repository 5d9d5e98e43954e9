"""A tiny random Qwen4-exp (mlx-vlm's ``qwen4_exp``, the Qwen3.8-Flash-Next family) saved as its
checkpoints are (config.json with ``text_config`` and ``vision_config``, the weights under the
model's own names, the tiny byte-level tokenizer): Gated DeltaNet layers with Qwen Sparse
Attention (QSA) layers between them, MoE feed-forwards, two residual streams (hyper-connections)
and an n-gram per-layer embedding (PLE) on its linear layer. QSA scores blocks of
``COMPRESS_RATIO`` keys and attends to the best ``BUDGET // COMPRESS_RATIO`` of them and the
tokens after the last whole block: contexts past ``SPARSE_FROM`` tokens drop positions."""

from __future__ import annotations

from typing import Any

from tests.support.tiny import SPECIAL_TOKENS, VOCAB_SIZE
from tests.support.tiny_vlm_family import TinyVlmFamily

BUDGET, COMPRESS_RATIO = 12, 4
# the first context a row reads sparsely: more whole blocks than the selection holds
SPARSE_FROM = (BUDGET // COMPRESS_RATIO + 1) * COMPRESS_RATIO
_EOS = SPECIAL_TOKENS.index("<|im_end|>")
TEXT_CONFIG: dict[str, Any] = dict(
    model_type="qwen4_exp",
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_hidden_layers=2,
    full_attention_interval=2,  # a linear layer, then a sparse one
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_value_heads=2,
    linear_num_key_heads=1,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    rms_norm_eps=1e-6,
    output_gate_type="sigmoid",
    max_position_embeddings=4096,
    hc_count=2,
    hc_lowrank=8,
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=16,
    indexer_budget=BUDGET,
    indexer_compress_ratio=COMPRESS_RATIO,
    ple_layer_ids=[1],
    ple_embed_dim=16,
    ngram_size=3,
    heads_per_ngram=2,
    ngram_vocab_size_base=100,
    split_ngram_parts=2,
    eos_token_id=_EOS,
    tie_word_embeddings=False,
    rope_parameters={
        "type": "default",
        "mrope_section": [2, 1, 1],
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    },
)
CONFIG: dict[str, Any] = dict(
    model_type="qwen4_exp",
    vocab_size=VOCAB_SIZE,
    eos_token_id=_EOS,
    image_token_id=5,
    video_token_id=6,
    vision_start_token_id=7,
    vision_end_token_id=8,
    text_config=TEXT_CONFIG,
    vision_config=dict(
        model_type="qwen4_exp",
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=64,
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=16,
        deepstack_visual_indexes=[],
    ),
)
# parameters mlx-vlm creates as zeros or ones (its zero-centred norms): random here, so the test
# sees each of them act
_RANDOMIZED = ("norm.weight", "layernorm.weight", "norm_key.weight", "norm_query.weight",
               "norm_conv.weight", "hc_norm.weight")  # fmt: skip

QWEN4_EXP = TinyVlmFamily("qwen4_exp", CONFIG, _RANDOMIZED)
save_qwen4_exp = QWEN4_EXP.save  # the tiny checkpoint in a folder; text config fields replaceable
