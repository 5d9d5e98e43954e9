"""A tiny random config for every model module of mlx-lm's ``mlx_lm/models/``: what the
every-architecture test builds (tests/engine/model/test_every_architecture.py).

Each module's config is derived, not written out: ``_COMMON`` (the fields most modules share,
tiny), then a value for every field its ``ModelArgs`` requires that ``_COMMON`` lacks (by name
from ``_BY_NAME``, else by its annotated type), then the module's row of ``OVERRIDES`` for what a
rule cannot guess. A module is a model when it defines ``Model`` and ``ModelArgs``; the rest
(``base``, ``cache``, ``rope_utils`` ...) are its helpers.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

import mlx_lm.models

from tests.support.tiny import HYBRID_CONFIGS, TINY_COMMON, VOCAB_SIZE, tiny_configs

# the parity tests' tiny sizes, with the other names modules give the same fields
_COMMON: dict[str, Any] = dict(
    TINY_COMMON, head_dim=16, layer_norm_eps=1e-5, norm_eps=1e-5, tie_word_embeddings=False
)
# MoE modules: four small experts
_MOE: dict[str, Any] = dict(
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    num_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
)
_COMMON.update(_MOE)
# MLA modules: one latent row of 64 + 16
_COMMON.update(
    kv_lora_rank=64,
    q_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
)
# what a required field of another name means, in the names other modules give it
_BY_NAME: dict[str, Any] = dict(
    n_embd=64, d_model=64, hidden_dim=64, dim=64, model_dim=64,
    n_layer=2, n_layers=2, num_layers=2,
    n_head=4, n_heads=4, num_heads=4,
    n_kv_heads=2, num_kv_heads=2,
    n_inner=128, ffn_hidden_size=128, ffn_dim=128,
    n_ctx=4096, n_positions=4096, block_size=4096, model_max_length=4096,
    layer_norm_epsilon=1e-5, norm_epsilon=1e-5,
    rotary_emb_base=10000.0, rotary_pct=1.0, partial_rotary_factor=1.0, rotary_dim=16,
    shared_intermediate_size=128, moe_shared_expert_intermediate_size=32,
    sliding_window=8, hidden_act="silu", num_vocab=VOCAB_SIZE, kv_channels=16,
    mlp_only_layers=[], decoder_sparse_step=1,
)  # fmt: skip
_BY_TYPE: dict[str, Any] = {"bool": False, "int": 2, "float": 1.0}

# what a rule cannot guess, per module
_SLIDING_FULL = ["sliding_attention", "full_attention"]
_MROPE_TEXT = dict(
    _COMMON, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=True
)
OVERRIDES: dict[str, dict[str, Any]] = {
    "afm7": dict(num_layers=4, num_kv_reuse_layers=2),
    "afmoe": dict(layer_types=_SLIDING_FULL, num_dense_layers=1, mup_enabled=False),
    "baichuan_m1": dict(sliding_window_layers=[0], conv_window=2),
    "cohere2": dict(sliding_window_pattern=2),
    # ratio-4 rows on layer 1 with a top-2 selection and a window of 8: the workload drops both
    "deepseek_v41": dict(
        head_dim=32,
        qk_rope_head_dim=8,
        o_groups=2,
        compress_ratios=[0, 4],
        kv_source_layer_ids=[1],
        index_source_layer_ids=[1],
        index_topk=2,
        index_n_heads=2,
        index_head_dim=16,
        hc_sinkhorn_iters=3,
    ),  # fmt: skip
    "dbrx": dict(
        ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
        attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
    ),
    "exaone_moe": dict(layer_types=_SLIDING_FULL, is_moe_layer=[False, True]),
    "jamba": dict(
        attn_layer_offset=1,
        attn_layer_period=2,
        expert_layer_offset=1,
        expert_layer_period=2,
        mamba_d_conv=4,
        mamba_d_state=16,
        mamba_expand=2,
    ),  # fmt: skip
    "lfm2_moe": dict(num_dense_layers=1, conv_L_cache=3, layer_types=["conv", "full_attention"]),
    "olmo3": dict(layer_types=_SLIDING_FULL),
    "openelm": dict(
        num_transformer_layers=2,
        num_query_heads=[4, 4],
        num_kv_heads=[2, 2],
        ffn_multipliers=[2.0, 2.0],
        ffn_dim_divisor=16,
    ),  # fmt: skip
    "spark2_5": dict(
        rope_parameters={
            "full_attention": {"rope_theta": 10000.0},
            "sliding_attention": {"rope_theta": 10000.0},
        },
        layer_types=_SLIDING_FULL,
        hidden_act="gelu",
    ),  # fmt: skip
    "recurrent_gemma": dict(
        conv1d_width=4,
        logits_soft_cap=30.0,
        attention_window_size=8,
        block_types=["recurrent", "attention"],
    ),  # fmt: skip
    "mimo_v2_flash": dict(
        hybrid_layer_pattern=[1, 0],
        moe_layer_freq=[0, 1],
        add_swa_attention_sink_bias=True,
        add_full_attention_sink_bias=False,
        sliding_window_size=8,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        layernorm_epsilon=1e-5,
        swa_rope_theta=10000.0,
        swa_num_attention_heads=4,
        swa_num_key_value_heads=2,
        swa_head_dim=16,
        swa_v_head_dim=16,
    ),  # fmt: skip
    "llama4_text": dict(
        intermediate_size_mlp=128,
        no_rope_layers=[1, 0],
        use_qk_norm=True,
        interleave_moe_layer_step=1,
    ),  # fmt: skip
    "mamba": dict(state_size=16, conv_kernel=4, time_step_rank=4, intermediate_size=128),
    "mamba2": dict(
        num_heads=4,
        head_dim=32,
        state_size=16,
        conv_kernel=4,
        n_groups=1,
        time_step_limit=(0.0, float("inf")),
        time_step_rank=4,
        expand=2,
    ),  # fmt: skip
    "qwen2_vl": dict(text_config=dict(_MROPE_TEXT, model_type="qwen2_vl")),
    "qwen3_vl": dict(text_config=dict(_MROPE_TEXT, model_type="qwen3_vl")),
    "qwen3_vl_moe": dict(
        text_config=dict(
            _MROPE_TEXT, model_type="qwen3_vl_moe", decoder_sparse_step=1, mlp_only_layers=[]
        )
    ),  # fmt: skip
    "qwen3_5_moe": dict(
        text_config=dict(
            HYBRID_CONFIGS["qwen3_5"],
            model_type="qwen3_5_moe",
            shared_expert_intermediate_size=32,
            **_MOE,
        )
    ),  # fmt: skip
    # four layers: three chunked (chunks of one block), then one without RoPE whose query
    # temperature changes every 4 positions
    "llama4": dict(
        text_config=dict(
            _COMMON,
            model_type="llama4_text",
            num_hidden_layers=4,
            intermediate_size_mlp=128,
            no_rope_layers=[1, 0],
            use_qk_norm=True,
            interleave_moe_layer_step=1,
            attention_chunk_size=8,
            floor_scale=4,
            attn_scale=2.0,
            num_experts_per_tok=1,
            attention_bias=False,
            rope_scaling=None,
        )
    ),  # fmt: skip
    "mellum": dict(
        layer_types=_SLIDING_FULL,
        rope_parameters={
            "sliding_attention": {"rope_theta": 10000.0},
            "full_attention": {"rope_theta": 10000.0},
        },
    ),  # fmt: skip
    "plamo": dict(n_shared_head=2),
    # a cap the tiny model's scores reach (Gemma 2's own, 50, would leave them as they are)
    "gemma2": dict(attn_logit_softcapping=0.5, final_logit_softcapping=5.0),
    "hunyuan": dict(
        moe_topk=2,
        num_shared_expert=1,
        use_mixed_mlp_moe=True,
        use_cla=False,
        cla_share_factor=2,
        rope_scaling={"alpha": 1.0, "factor": 1.0, "type": "dynamic"},
    ),  # fmt: skip
    "olmo_hybrid": dict(
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
    ),  # fmt: skip
    # as its real checkpoints: a layer with attention and MLP, one whose attention is off, one
    # whose attention and MLP are each one linear layer, one whose MLP is off
    "nemotron-nas": dict(
        num_hidden_layers=4,
        hidden_act="silu",
        block_configs=[
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"no_op": True}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"replace_with_linear": True}, "ffn": {"replace_with_linear": True}},
            {"attention": {"n_heads_in_group": 2}, "ffn": {"no_op": True}},
        ],
    ),  # fmt: skip
    # one 2-bit Hadamard-packed projection (128 wide, as packs must be) in a Qwen3.5 text model
    "prism_hadamard_qwen35": dict(
        text_config=HYBRID_CONFIGS["qwen3_5"],
        schema_version=1,
        tensor_namespace="mlx-lm-text",
        quantization={"bits": 2, "group_size": 128, "mode": "affine"},
        modules=[
            {
                "path": "model.layers.0.mlp.down_proj",
                "embedding": False,
                "dtype": "float16",
                "block": 0,
            }
        ],
    ),  # fmt: skip
    "pixtral": dict(text_config=dict(_COMMON, model_type="mistral")),
    "lfm2-vl": dict(
        text_config=dict(
            _COMMON,
            model_type="lfm2",
            conv_L_cache=3,
            full_attn_idxs=[1],
            block_dim=64,
            block_ff_dim=128,
            block_multiple_of=16,
            block_ffn_dim_multiplier=1.0,
            block_auto_adjust_ff_dim=False,
            conv_bias=False,
        )
    ),  # fmt: skip
}


def model_modules() -> list[str]:
    """Every module of ``mlx_lm/models/`` that defines a model (``Model`` and ``ModelArgs``), and
    those that cannot be imported here (``import_problem``)."""
    return [name for name in _module_names() if not _is_helper(name)]


def helper_modules() -> list[str]:
    """The modules of ``mlx_lm/models/`` that are a model's helpers (no ``Model`` and
    ``ModelArgs``), as ``base``, ``cache`` and ``rope_utils``."""
    return [name for name in _module_names() if _is_helper(name)]


def import_problem(name: str) -> str | None:
    """Why module ``name`` cannot be imported here (None: it can)."""
    try:
        importlib.import_module(f"mlx_lm.models.{name}")
    except ImportError as exc:
        return str(exc)
    except SystemExit:  # olmo asks for a package it lacks and exits
        return "it exits on import, asking for a package that is not installed"
    return None


def _module_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__))


def _is_helper(name: str) -> bool:
    if import_problem(name) is not None:
        return False
    module = importlib.import_module(f"mlx_lm.models.{name}")
    return not (hasattr(module, "Model") and hasattr(module, "ModelArgs"))


def tiny_config(name: str) -> dict[str, Any]:
    """The tiny config of model module ``name`` (a config.json's fields)."""
    module = importlib.import_module(f"mlx_lm.models.{name}")
    known = tiny_configs().get(name)
    if known is not None:  # the parity tests' own tiny config of it
        return dict(known, **OVERRIDES.get(name, {}))
    config: dict[str, Any] = dict(_COMMON, model_type=name)
    for field in dataclasses.fields(module.ModelArgs):
        required = field.default is dataclasses.MISSING and (
            field.default_factory is dataclasses.MISSING
        )
        if field.name in config:
            continue
        if field.name in _BY_NAME:  # given or not: another name for a size _COMMON keeps tiny
            config[field.name] = _BY_NAME[field.name]
        elif required:
            config[field.name] = _BY_TYPE.get(getattr(field.type, "__name__", ""))
    config.update(OVERRIDES.get(name, {}))
    return config
