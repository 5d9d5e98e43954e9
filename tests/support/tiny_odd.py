"""Tiny configs of the mlx-lm families whose layers are built unlike the usual decoder: K/V heads
tiled rather than grouped (PLaMo), a cache several layers share (Gemma 3n), a second loop over
the layers attending over the first's K/V (IQuest-Loop-Coder), a model that takes its mask by
position (Phixtral), position ids counted from the cache's offset (GPT-BigCode), cache lists of
one part (MiniMax M3), layers that read their state as ``cache[0]`` (Bailing's GLA layers,
RecurrentGemma), models with only recurrent layers (Mamba, Mamba 2, RWKV-7); and the ones the
engine refuses with a reason (AFM 7, Llama 4's chunked attention, Baichuan-M1)."""

from __future__ import annotations

from typing import Any

from tests.support.tiny import TINY_COMMON as _C
from tests.support.tiny import VOCAB_SIZE

# served: greedy tokens identical to mlx-lm's
ODD_CONFIGS: dict[str, dict[str, Any]] = {
    # two cached layers, then two KV-reuse layers attending over the last one's K/V
    "afm7": dict(
        model_type="afm7",
        vocab_size=VOCAB_SIZE,
        hidden_dim=64,
        num_layers=4,
        num_kv_reuse_layers=2,
        num_heads=4,
        num_kv_heads=2,
    ),
    "plamo": dict(_C, model_type="plamo", n_shared_head=2),
    "iquestloopcoder": dict(_C, model_type="iquestloopcoder", head_dim=16, loop_window_size=8),
    "phixtral": dict(
        model_type="phixtral",
        num_vocab=VOCAB_SIZE,
        model_dim=64,
        num_heads=4,
        num_layers=2,
        rotary_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "gpt_bigcode": dict(
        model_type="gpt_bigcode",
        n_embd=64,
        n_layer=2,
        n_inner=128,
        n_head=4,
        n_positions=4096,
        layer_norm_epsilon=1e-5,
        vocab_size=VOCAB_SIZE,
    ),
    "recurrent_gemma": dict(
        _C,
        model_type="recurrent_gemma",
        num_hidden_layers=3,
        attention_bias=False,
        conv1d_width=4,
        logits_soft_cap=30.0,
        attention_window_size=16,
        block_types=["recurrent", "recurrent", "attention"],
        num_key_value_heads=1,
    ),
    "mamba": dict(
        model_type="mamba",
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        state_size=16,
        num_hidden_layers=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=8,
    ),
    "mamba2": dict(
        model_type="mamba2",
        num_heads=8,
        head_dim=16,
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        state_size=16,
        num_hidden_layers=2,
        layer_norm_epsilon=1e-5,
        conv_kernel=4,
        n_groups=1,
        use_bias=False,
        use_conv_bias=True,
        tie_word_embeddings=True,
        time_step_limit=(0.0, 1e9),
        time_step_rank=8,
    ),
    "rwkv7": dict(
        model_type="rwkv7",
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        norm_eps=1e-5,
        head_dim=16,
        num_hidden_layers=2,
        a_low_rank_dim=8,
        v_low_rank_dim=8,
        gate_low_rank_dim=8,
        decay_low_rank_dim=8,
    ),
    "gemma3n": dict(
        model_type="gemma3n",
        text_config=dict(
            _C,
            model_type="gemma3n_text",
            num_hidden_layers=4,
            head_dim=16,
            num_kv_shared_layers=2,
            vocab_size_per_layer_input=VOCAB_SIZE,
            sliding_window=8,
            rope_local_base_freq=10000.0,
            final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention"] * 2,
            activation_sparsity_pattern=[0.0] * 4,
            hidden_size_per_layer_input=16,
            altup_num_inputs=2,
            altup_coef_clip=120.0,
            altup_correct_scale=True,
            altup_active_idx=0,
            laurel_rank=8,
        ),
    ),
    "minimax_m3_vl": dict(
        model_type="minimax_m3_vl",
        text_config=dict(
            _C,
            model_type="minimax_m3",
            dense_intermediate_size=128,
            shared_intermediate_size=64,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    "bailing_moe_linear": dict(
        _C,
        model_type="bailing_moe_linear",
        num_hidden_layers=4,
        moe_intermediate_size=32,
        num_experts=4,
        num_shared_experts=1,
        norm_topk_prob=True,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        layer_group_size=2,
        group_norm_size=1,
        head_dim=16,
        topk_group=1,
    ),
}

# refused at load, each with its reason (families.py), or by the probe without its table entry
# (llama4: served through its entry)
REFUSED_ODD_CONFIGS: dict[str, dict[str, Any]] = {
    "baichuan_m1": dict(
        _C,
        model_type="baichuan_m1",
        num_hidden_layers=3,
        sliding_window=8,
        sliding_window_layers=[1],
        conv_window=2,
    ),
    "llama4": dict(
        model_type="llama4",
        text_config=dict(
            _C,
            model_type="llama4_text",
            num_hidden_layers=4,
            attention_bias=False,
            attention_chunk_size=8,
            head_dim=16,
            interleave_moe_layer_step=2,
            intermediate_size_mlp=128,
            num_experts_per_tok=1,
            num_local_experts=4,
            rope_scaling=None,
            use_qk_norm=True,
        ),
    ),
}
