"""Tiny random-weight models of the families whose text model only mlx-vlm has (MiniMax M3,
Step 3.7, Mistral Large 3), built from mlx-vlm's own classes and saved as their checkpoints are
(config.json, safetensors under the names mlx-vlm's ``sanitize`` reads, the tiny byte-level
tokenizer), so both mlx-vlm's loader and the engine's read them offline (docs/models.md,
"Families only mlx-vlm has")."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from tests.support.tiny import HYBRID_CONFIGS, SPECIAL_TOKENS, VOCAB_SIZE, save_tokenizer
from tests.support.vlm_architectures import vlm_config

_ROUTED = dict(hidden_size=64, num_attention_heads=4, vocab_size=VOCAB_SIZE)
# the text-only families' common sizes
_TEXT = dict(
    _ROUTED,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
_EXPERTS = dict(num_experts=4, num_experts_per_tok=2)
_ALTERNATING = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2)


def _vlm(model_type: str, text: str, vision: str) -> dict[str, Any]:
    """A VLM's config: a two-layer text model of mlx-vlm's ``text`` and a one-layer tower."""
    return dict(
        model_type=model_type,
        vocab_size=VOCAB_SIZE,
        image_token_index=5,
        text_config=dict(_TEXT, model_type=text, num_hidden_layers=2, intermediate_size=96),
        vision_config=dict(
            model_type=vision,
            hidden_size=32,
            num_hidden_layers=1,
            intermediate_size=64,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
            projection_dim=32,
        ),
    )


# Qwen3.5's text-only layout: Gated DeltaNet layers (mlx-vlm's, keeping their state through its
# ArraysCache's update_window and update_recurrent) between full-attention ones
_QWEN3_5_TEXT = HYBRID_CONFIGS["qwen3_5"]  # mlx-lm's tiny qwen3_5, each model_type its own

# family -> its config.json (each small enough to run in a test, each exercising what its real
# checkpoints have: MoE layers beside dense ones, sliding-window layers, MLA)
CONFIGS: dict[str, dict[str, Any]] = {
    # text only: dense layer 0, two MoE layers (sigmoid routing with a bias, a shared expert),
    # partial rotary dims, per-head QK norms; no sparse (indexed) layers: those are the sparse
    # attention issue's
    "minimax_m3": dict(
        _ROUTED,
        model_type="minimax_m3",
        intermediate_size=32,
        dense_intermediate_size=96,
        shared_intermediate_size=32,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=3,
        num_local_experts=4,
        num_experts_per_tok=2,
        moe_layer_freq=[0, 1, 1],
        sparse_attention_config={"use_sparse_attention": False},
        max_position_embeddings=4096,
        rope_theta=10000.0,
    ),
    "qwen3_5_text": dict(_QWEN3_5_TEXT, model_type="qwen3_5_text"),
    # its experts and shared expert in every layer
    "qwen3_5_moe_text": dict(
        _QWEN3_5_TEXT,
        **_EXPERTS,
        model_type="qwen3_5_moe_text",
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    ),
    # Qwen3.5's text model under another checkpoint layout (a decision model's)
    "decider2": dict(_QWEN3_5_TEXT, model_type="decider2"),
    # a plain decoder (K2 Think's)
    "k2_horizon": dict(_TEXT, model_type="k2_horizon", num_hidden_layers=2, intermediate_size=96),
    # Cohere's MoE: every second layer sliding (window 8), sigmoid-gated experts and a shared one
    "cohere2_moe": dict(
        _TEXT,
        **_EXPERTS,
        model_type="cohere2_moe",
        num_hidden_layers=4,
        intermediate_size=96,
        sliding_window=8,
        sliding_window_pattern=2,
        moe_num_shared_experts=1,
        layer_norm_eps=1e-5,
    ),
    # a dense first layer, then routed experts beside a shared one
    "klear": dict(
        _TEXT,
        **_EXPERTS,
        model_type="klear",
        num_hidden_layers=2,
        intermediate_size=96,
        attention_bias=False,
        mlp_only_layers=[0],
        decoder_sparse_step=1,
        n_shared_experts=1,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
    # MoE, sliding and full layers alternating
    "kolibri1": dict(
        _TEXT,
        **_EXPERTS,
        **_ALTERNATING,
        model_type="kolibri1",
        num_hidden_layers=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    ),
    # sliding and full layers, learnable attention sinks, a NoPE layer, a dense first layer
    "flint": dict(
        _TEXT,
        **_EXPERTS,
        **_ALTERNATING,
        model_type="flint",
        num_hidden_layers=4,
        intermediate_size=96,
        no_rope_layer_indices=[3],
        mlp_only_layers=[0],
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    ),
    # DeepSeek V3's MLA and experts inside hyper-connections (two residual streams per token,
    # mixed by Sinkhorn-normalised weights around each attention and MLP)
    "xing4_0": dict(
        _TEXT,
        model_type="xing4_0",
        num_hidden_layers=2,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        kv_lora_rank=32,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        first_k_dense_replace=1,
        hc_mult=2,
        hc_sinkhorn_iters=3,
    ),
    # a hierarchical reasoning model: its layer stacks run H x L cycles per token, each cycle's
    # layers with caches of their own
    "hrm_text": dict(
        _TEXT,
        model_type="hrm_text",
        num_hidden_layers=4,
        intermediate_size=96,
        num_key_value_heads=4,
        H_cycles=2,
        L_cycles=2,
    ),
    # VLMs of a plain decoder (LLaVA-NeXT's Llama, LLaVA-OneVision's and InternVL's Qwen2) under
    # their towers (CLIP, SigLIP, InternViT): tiny towers, never run (text only)
    "llava_next": _vlm("llava_next", "llama", "clip_vision_model"),
    "llava_onevision": _vlm("llava_onevision", "qwen2", "siglip_vision_model"),
    "internvl_chat": _vlm("internvl_chat", "qwen2", "intern_vit_6b"),
    # LLM-jp-VL's Llama and Granite Vision's Granite under SigLIP towers
    "llmjpvl": _vlm("llmjpvl", "llama", "siglip_vision_model"),
    "granite_vision": _vlm("granite_vision", "granite", "siglip_vision_model"),
    # a VLM: sliding-window layers (window 8, shorter than most prompts) of their own head
    # count between full ones, per-layer rope bases and partial rotary factors, head-wise
    # attention gates, MoE with a shared expert on layers 2 and 3
    "step3p7": dict(
        model_type="step3p7",
        vocab_size=VOCAB_SIZE,
        image_token_id=5,
        text_config=dict(
            _ROUTED,
            intermediate_size=96,
            num_attention_groups=2,
            num_hidden_layers=4,
            moe_intermediate_size=32,
            moe_num_experts=4,
            moe_top_k=2,
            share_expert_dim=32,
            head_dim=16,
            layer_types=["sliding_attention", "full_attention"] * 2,
            sliding_window=8,
            moe_layers_enum=[2, 3],
            max_position_embeddings=4096,
            use_head_wise_attn_gate=True,
            partial_rotary_factors=[0.5, 1.0, 0.5, 1.0],
            rope_theta=[10000.0, 5000.0, 10000.0, 5000.0],
            attention_other_setting={"num_attention_heads": 4, "num_attention_groups": 4},
        ),
        vision_config=dict(width=32, layers=1, heads=2, image_size=56, patch_size=14),
    ),
    # a VLM: DeepSeek V3's MLA and routed experts under a Pixtral tower
    "mistral_large3": dict(
        model_type="mistral_large3",
        vocab_size=VOCAB_SIZE,
        image_token_id=5,
        text_config=dict(
            _ROUTED,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_key_value_heads=4,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            max_position_embeddings=4096,
        ),
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            head_dim=16,
            intermediate_size=64,
            image_size=56,
            patch_size=14,
        ),
    ),
}


# families saved under the names mlx-vlm's model holds its weights (an mlx-vlm conversion's, which
# their ``sanitize`` takes as they are; the VLMs of a plain decoder: their Hugging Face names too;
# Mistral Large 3's other form is Mistral's consolidated layout); the others under their Hugging
# Face names (``model.layers...``, ``lm_head``), which their ``sanitize`` moves under
# ``language_model``
_HELD_NAMES = frozenset(
    {"mistral_large3", "llava_next", "llava_onevision", "internvl_chat", "llmjpvl",
     "granite_vision"}
)  # fmt: skip


def vlm_text_model(
    family: str,
    seed: int = 0,
    vision: dict[str, Any] | None = None,
    top: dict[str, Any] | None = None,
    **overrides: Any,
) -> tuple[Any, dict[str, Any]]:
    """mlx-vlm's own model of the tiny ``family`` (float32, random weights of ``seed``) and its
    config.json, ``overrides`` merged into it (for a VLM: into its text config, ``vision`` into
    its vision config, ``top`` into its top level: a family whose text fields sit there, as
    Phi-4-multimodal's); a family not in ``CONFIGS`` gets its derived config
    (``vlm_architectures.py``)."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    config = copy.deepcopy(CONFIGS[family]) if family in CONFIGS else vlm_config(family)
    config.get("text_config", config).update(overrides)
    config.update(top or {})
    config.get("vision_config", {}).update(vision or {})
    module, _ = get_model_and_args(copy.deepcopy(config))
    mx.random.seed(seed)
    # its config objects as mlx-vlm's loader makes them (the parts' own classes)
    model_config = module.ModelConfig.from_dict(copy.deepcopy(config))
    parts = ["text", "vision", "perceiver", "projector", "audio"]
    model = module.Model(update_module_configs(model_config, module, copy.deepcopy(config), parts))
    model.set_dtype(mx.float32)
    config["eos_token_id"] = SPECIAL_TOKENS.index("<|im_end|>")
    return model, config


def save_vlm_text_model(
    path: Path, family: str, seed: int = 0, top: dict[str, Any] | None = None, **overrides: Any
) -> Path:
    """The tiny ``family`` checkpoint (``vlm_text_model``) in ``path``, saved under mlx-vlm's
    names (or, for the families of ``CONFIGS`` not held under them, their Hugging Face ones)."""
    model, config = vlm_text_model(family, seed, top=top, **overrides)
    return save_vlm_model(path, family, model, config)


def save_vlm_model(path: Path, family: str, model: Any, config: dict[str, Any]) -> Path:
    """``model`` (mlx-vlm's, of ``family``) and its ``config`` as a checkpoint in ``path``, under
    the names ``save_vlm_text_model`` uses: apart from it for a model changed after it was built
    (benchmarks/dflash.py's target, its layers scaled to agree with a drafter)."""
    weights = dict(tree_flatten(model.parameters()))
    if family in CONFIGS and family not in _HELD_NAMES:
        weights = {key.removeprefix("language_model."): v for key, v in weights.items()}
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(path)
    return path
