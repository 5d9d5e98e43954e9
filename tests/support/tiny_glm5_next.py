"""A tiny random GLM5-next (mlx-vlm's ``glm5_next``) saved as its checkpoints are (config.json
with ``text_config`` and ``vision_config``, the weights under the model's own names, the tiny
byte-level tokenizer): a linear-attention layer (Gated DeltaNet over a short convolution), then a
sparse MLA layer with its own pooling indexer and one sharing its selection, four residual
streams (hyper-connections) and an MoE feed-forward. The indexer pools its keys in windows of
``KPOOL`` tokens and attends to the best ``TOPK // KPOOL`` pools and the tokens after the last
whole one: contexts past ``SPARSE_FROM`` tokens drop positions."""

from __future__ import annotations

from typing import Any

from tests.support.tiny import SPECIAL_TOKENS, VOCAB_SIZE
from tests.support.tiny_vlm_family import TinyVlmFamily

TOPK, KPOOL = 8, 4
# the first context a row reads sparsely: more whole pools than the selection holds
SPARSE_FROM = (TOPK // KPOOL + 1) * KPOOL
_EOS = SPECIAL_TOKENS.index("<|im_end|>")
TEXT_CONFIG: dict[str, Any] = dict(
    model_type="glm5_next_text",
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    layer_types=["linear_attention", "deepseek_sparse_attention", "deepseek_sparse_attention"],
    indexer_types=["full", "full", "shared"],
    mlp_layer_types=["dense", "sparse", "dense"],
    num_attention_heads=2,
    num_key_value_heads=2,
    n_shared_experts=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    kv_lora_rank=32,
    q_lora_rank=32,
    qk_rope_head_dim=0,
    qk_nope_head_dim=16,
    v_head_dim=16,
    index_topk=TOPK,
    index_kpool=KPOOL,
    index_head_dim=16,
    index_n_heads=16,  # many: a pool every head scores below zero ties at 0
    linear_num_heads=2,
    linear_head_dim=16,
    linear_conv_kernel_dim=4,
    hc_mult=4,
    max_position_embeddings=4096,
    eos_token_id=_EOS,
    pad_token_id=0,
    tie_word_embeddings=False,
)
CONFIG: dict[str, Any] = dict(
    model_type="glm5_next",
    vocab_size=VOCAB_SIZE,
    eos_token_id=_EOS,
    image_token_id=5,
    video_token_id=6,
    text_config=TEXT_CONFIG,
    vision_config=dict(
        depth=1,
        hidden_size=32,
        num_heads=2,
        intermediate_size=64,
        out_hidden_size=64,
        projection_intermediate_size=64,
    ),
)
# parameters mlx-vlm creates as zeros (the indexer's pooling gate and position bias, the gates'
# correction bias, the linear attention's decay): random here, so the test sees each of them act
_RANDOMIZED = ("index_kpool_compress_ape", "index_kpool_compress_gate", "A_log", "dt_bias",
               "e_score_correction_bias", "gate.weight")  # fmt: skip

GLM5_NEXT = TinyVlmFamily("glm5_next", CONFIG, _RANDOMIZED)
save_glm5_next = GLM5_NEXT.save  # the tiny checkpoint in a folder; text config fields replaceable
