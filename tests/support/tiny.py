"""Tiny random-weight models built from mlx-lm's own classes, and a small real tokenizer.

Nothing here downloads anything: models are built in memory (or saved in Hugging Face layout when
the loading path is under test) and the tokenizer is a byte-level BPE trained in-process.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

VOCAB_SIZE = 384
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same template with a thinking switch as Qwen3's (thinks unless told not to): "off" adds text.
THINKING_TEMPLATE = (
    CHAT_TEMPLATE
    + "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
)
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today? I am fine, thank you.",
    "MLX runs on Apple silicon; macbatch batches many prompts at once.",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? . , ; : ' \"",
    "Summarize the following article in one sentence.",
] * 20

TINY_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=4096,
    rope_theta=10000.0,
)

ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(TINY_COMMON, model_type="llama", tie_word_embeddings=False),
    "qwen2": dict(TINY_COMMON, model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(TINY_COMMON, model_type="qwen3", head_dim=16, tie_word_embeddings=True),
    "gemma3_text": dict(
        TINY_COMMON,
        model_type="gemma3_text",
        num_hidden_layers=3,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        sliding_window_pattern=3,
    ),
    "ministral3": dict(
        TINY_COMMON,
        model_type="ministral3",
        head_dim=16,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_theta": 10000.0,
            "rope_type": "yarn",
            "factor": 1.0,
            "original_max_position_embeddings": 4096,
            "llama_4_scaling_beta": 0.1,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
    "gpt_oss": dict(
        TINY_COMMON,
        model_type="gpt_oss",
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ),
}


# Multi-head latent attention (MLA): one latent row (kv_lora_rank + qk_rope_head_dim = 96) per
# token per layer, whose quantization groups of 32 end where the latent does (as 512 + 64 rows'
# groups of 64 do), so rounding the latent and the RoPE key apart, as an oracle over mlx-lm's
# cache does, is the pages' rounding; the MoE ones with 4 experts, the first layer dense. The
# yarn settings make DeepSeek's softmax scale carry mscale (factor > 1).
_MLA = dict(
    TINY_COMMON,
    num_hidden_layers=3,
    num_key_value_heads=4,
    kv_lora_rank=64,
    q_lora_rank=32,
    qk_rope_head_dim=32,
    qk_nope_head_dim=16,
    v_head_dim=16,
    tie_word_embeddings=False,
)
_MLA_MOE = dict(
    _MLA,
    moe_intermediate_size=32,
    n_shared_experts=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    routed_scaling_factor=1.5,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
)
_YARN = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 1024,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
# Kimi Linear: Kimi Delta Attention layers among MLA layers that rotate nothing (NoPE)
_KIMI_LINEAR = dict(
    _MLA,
    model_type="kimi_linear",
    num_hidden_layers=4,
    head_dim=16,
    linear_attn_config={
        "kda_layers": [1, 3],
        "num_heads": 4,
        "head_dim": 16,
        "short_conv_kernel_size": 4,
    },  # fmt: skip
    model_max_length=4096,
    num_experts=4,
    num_experts_per_token=2,
    num_shared_experts=1,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    mla_use_nope=True,
)
_BAILING = dict(
    _MLA_MOE,
    num_hidden_layers=4,
    head_dim=16,
    num_experts=4,
    num_shared_experts=1,
    moe_shared_expert_intermediate_size=32,
    layer_group_size=2,
)
MLA_CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek_v3": dict(_MLA_MOE, model_type="deepseek_v3", rope_scaling=_YARN),
    "glm4_moe_lite": dict(_MLA_MOE, model_type="glm4_moe_lite", rope_theta=1_000_000.0),
    "deepseek_v2": dict(
        _MLA_MOE,
        model_type="deepseek_v2",
        q_lora_rank=None,
        topk_method="greedy",
        rope_scaling=_YARN,
    ),
    "minicpm3": dict(
        _MLA,
        model_type="minicpm3",
        v_head_dim=None,  # minicpm3's is hidden_size / heads
        dim_model_base=32,
        scale_depth=1.4,
        scale_emb=12,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0] * 16,
            "long_factor": [1.0] * 16,
            "original_max_position_embeddings": 4096,
        },  # fmt: skip
    ),
    "youtu_llm": dict(_MLA, model_type="youtu_llm", rope_traditional=True),
    "mistral4": dict(
        _MLA_MOE,
        model_type="mistral4",
        rope_parameters={
            "rope_theta": 10000.0,
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "llama_4_scaling_beta": 0.1,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
    # Kimi K2.5 and Kimi-VL: a DeepSeek V3 text model in a multimodal wrapper
    "kimi_k25": dict(model_type="kimi_k25", text_config=dict(_MLA_MOE, model_type="deepseek_v3")),
    "kimi_vl": dict(model_type="kimi_vl", text_config=dict(_MLA_MOE, model_type="deepseek_v3")),
    "kimi_linear": _KIMI_LINEAR,
    # LongCat Flash: two MLA attentions per layer (a CacheList of two caches), a MoE with zero
    # (identity) experts beside its two MLPs
    "longcat_flash": dict(
        _MLA,
        model_type="longcat_flash",
        attention_method="MLA",
        zero_expert_type="identity",
        ffn_hidden_size=128,
        moe_topk=2,
        expert_ffn_hidden_size=32,
        n_routed_experts=4,
        zero_expert_num=2,
        num_layers=2,
        routed_scaling_factor=1.0,
        mla_scale_q_lora=True,
        mla_scale_kv_lora=True,
        attention_bias=False,
    ),
    # Kimi K3: Kimi Linear's layers, each token's hidden states mixed with the attention-residual
    # blocks of every 2 layers before (a tuple the layers pass on)
    "kimi_k3": dict(
        model_type="kimi_k3",
        text_config=dict(_KIMI_LINEAR, mla_use_output_gate=True, attn_res_block_size=2),
    ),
    # Ling 2.5 (bailing_moe_v3): Kimi Delta Attention layers, then an MLA layer with a gate per
    # head, in groups of 2 here
    "bailing_moe_v3": dict(_BAILING, model_type="bailing_moe_v3", short_conv_kernel_size=4),
    # Bailing hybrid: linear-attention (GLA) layers that read their state as cache[0]
    "bailing_hybrid": dict(_BAILING, model_type="bailing_hybrid", group_norm_size=1),
}
# DeepSeek Sparse Attention: MLA with a lightning indexer, its fields and weight names as
# DeepSeek-V3.2's and GLM-5's config.json have them (``index_head_dim``, ``index_n_heads``,
# ``index_topk``; GLM's rope under ``rope_parameters``, its indexer rope interleaved), cut to a
# top-12 selection of 64-wide keys (32 of them roped, in quantization groups of 32 as the latent
# rows') over 16 heads (so two positions whose ReLUs are all zero, an exact tie, are rare):
# prompts past 12 tokens drop positions.
_DSA = dict(
    _MLA_MOE,
    index_head_dim=64,
    index_n_heads=16,
    index_topk=12,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    moe_layer_freq=1,
    attention_bias=False,
)
SPARSE_MLA_CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek_v32": dict(_DSA, model_type="deepseek_v32", rope_scaling=_YARN),
    "glm_moe_dsa": dict(
        _DSA,
        model_type="glm_moe_dsa",
        rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"},
        indexer_rope_interleave=True,
    ),
}
# MLA families mlx-lm has that the engine refuses at load (families.py says why)
REFUSED_MLA_CONFIGS: dict[str, dict[str, Any]] = {
    "longcat_flash_ngram": dict(MLA_CONFIGS["longcat_flash"], model_type="longcat_flash_ngram"),
}


# Hybrid models: a few attention layers among recurrent ones (docs/models.md, "Hybrid models").
HYBRID_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_5": dict(
        TINY_COMMON,
        model_type="qwen3_5",
        num_hidden_layers=4,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        tie_word_embeddings=True,
        rope_parameters={
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
        },
    ),
    "qwen3_next": dict(
        TINY_COMMON,
        model_type="qwen3_next",
        num_hidden_layers=4,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=64,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        partial_rotary_factor=0.5,
    ),
    "lfm2": dict(
        TINY_COMMON,
        model_type="lfm2",
        num_hidden_layers=4,
        norm_eps=1e-5,
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        block_ff_dim=128,
        full_attn_idxs=[1, 3],
    ),
    "nemotron_h": dict(
        TINY_COMMON,
        model_type="nemotron_h",
        attention_bias=False,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=16,
        mamba_proj_bias=False,
        ssm_state_size=16,
        conv_kernel=4,
        n_groups=2,
        mlp_bias=False,
        layer_norm_epsilon=1e-5,
        use_bias=False,
        use_conv_bias=True,
        hybrid_override_pattern=["M", "*", "-", "M", "-"],
        time_step_limit=[0.0, 1e9],
    ),
    "granitemoehybrid": dict(
        TINY_COMMON,
        model_type="granitemoehybrid",
        num_hidden_layers=4,
        attention_bias=False,
        embedding_multiplier=1.0,
        attention_multiplier=0.25,
        logits_scaling=1.0,
        residual_multiplier=1.0,
        layer_types=["mamba", "attention", "mamba", "mamba"],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_proj_bias=False,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_n_groups=1,
        mamba_conv_bias=True,
        shared_intermediate_size=128,
    ),
    # Attention and a Mamba 2 mixer side by side in every layer (one CacheList each). The
    # multipliers are mlx-lm's defaults (its sanitize folds them into the weights at load).
    "falcon_h1": dict(
        TINY_COMMON,
        model_type="falcon_h1",
        num_hidden_layers=3,
        head_dim=16,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_n_groups=1,
        mamba_rms_norm=True,
        tie_word_embeddings=False,
    ),
}

_GEMMA4_TEXT = dict(
    TINY_COMMON,
    model_type="gemma4_text",
    num_hidden_layers=4,
    head_dim=16,
    global_head_dim=32,
    num_key_value_heads=1,
    num_kv_shared_layers=2,  # layers 2 and 3 reuse the K/V of layers 0 and 1
    hidden_size_per_layer_input=32,
    vocab_size_per_layer_input=VOCAB_SIZE,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"] * 2,
    tie_word_embeddings=True,
)

# Multimodal checkpoints keep the text model at `language_model` (vision weights are dropped by
# mlx-lm's sanitize; these tiny ones have none).
WRAPPER_CONFIGS: dict[str, dict[str, Any]] = {
    "gemma3": dict(
        model_type="gemma3", vocab_size=VOCAB_SIZE, text_config=ARCH_CONFIGS["gemma3_text"]
    ),
    "mistral3": dict(
        model_type="mistral3",
        text_config=dict(ARCH_CONFIGS["llama"], model_type="mistral", head_dim=16),
    ),
    "mistral3-ministral3": dict(model_type="mistral3", text_config=ARCH_CONFIGS["ministral3"]),
    "gemma4": dict(model_type="gemma4", vocab_size=VOCAB_SIZE, text_config=_GEMMA4_TEXT),
}
ARCH_CONFIGS.update(WRAPPER_CONFIGS)


def build_model(arch: str = "qwen3", seed: int = 0, **overrides: Any) -> nn.Module:
    """A float32 random-weight model of `arch`, evaluated and ready to run."""
    return model_of(dict(_config(arch), **overrides), seed)


def model_of(config: dict[str, Any], seed: int = 0) -> nn.Module:
    """A float32 random-weight model of a config.json's fields, evaluated and ready to run."""
    config = copy.deepcopy(config)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def build_tokenizer_json() -> str:
    """A byte-level BPE tokenizer (JSON text) whose vocabulary fits `VOCAB_SIZE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    return tokenizer.to_str()


def save_model(
    path: Path,
    arch: str = "qwen3",
    seed: int = 0,
    *,
    drop_lm_head: bool = False,
    chat_template: str = CHAT_TEMPLATE,
    **overrides: Any,
) -> Path:
    """Write a tiny model in Hugging Face layout (config, safetensors, tokenizer files).

    ``drop_lm_head`` leaves the output projection out, as tied checkpoints (Gemma 3) do."""
    path.mkdir(parents=True, exist_ok=True)
    model = build_model(arch, seed, **overrides)
    config = copy.deepcopy(dict(_config(arch), **overrides))
    config["eos_token_id"] = SPECIAL_TOKENS.index("<|im_end|>")
    (path / "config.json").write_text(json.dumps(config, indent=2))
    weights = dict(tree_flatten(model.parameters()))
    if drop_lm_head:
        weights = {k: v for k, v in weights.items() if not k.endswith("lm_head.weight")}
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    save_tokenizer(path, chat_template)
    return path


def randomize(model: nn.Module, suffixes: tuple[str, ...], scale: float) -> None:
    """``model``'s parameters named with one of ``suffixes`` (the ones its classes create as
    zeros or ones) drawn at random, so a test sees each of them act."""
    params = tree_flatten(model.parameters())
    model.load_weights(
        [(k, mx.random.normal(v.shape) * scale) for k, v in params if k.endswith(suffixes)],
        strict=False,
    )


def save_checkpoint(path: Path, model: nn.Module, config: dict[str, Any]) -> Path:
    """``model``'s weights under its own names, ``config`` as config.json and the tiny
    tokenizer in ``path`` (an mlx-vlm family's tiny checkpoint)."""
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(path)
    return path


def save_tokenizer(path: Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """The tiny tokenizer's files in ``path`` (EOS ``<|im_end|>``, no BOS)."""
    (path / "tokenizer.json").write_text(build_tokenizer_json())
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "chat_template": chat_template,
        "model_max_length": 4096,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


def save_two_models(root: Path) -> dict[str, Path]:
    """Two different tiny models under ``root`` in Hugging Face layout, by folder name: alpha
    (qwen3) and beta (llama), for the many-models tests (serve, chat, run)."""
    return {
        "alpha": save_model(root / "alpha", arch="qwen3", seed=0),
        "beta": save_model(root / "beta", arch="llama", seed=1),
    }


def tiny_configs() -> dict[str, dict[str, Any]]:
    """Every tiny config here, by its model type (the first of a type where several share one)."""
    from tests.support.tiny_odd import ODD_CONFIGS  # it imports this module

    configs: dict[str, dict[str, Any]] = {}
    tables = (ARCH_CONFIGS, MLA_CONFIGS, SPARSE_MLA_CONFIGS, REFUSED_MLA_CONFIGS, HYBRID_CONFIGS)
    for table in (*tables, ODD_CONFIGS):
        for config in table.values():
            configs.setdefault(config["model_type"], config)
            text = config.get("text_config")
            if text is not None and "model_type" in text:  # a wrapper's text model
                configs.setdefault(text["model_type"], text)
    return configs


def _config(arch: str) -> dict[str, Any]:
    from tests.support.tiny_odd import ODD_CONFIGS, REFUSED_ODD_CONFIGS  # they import this one

    for configs in (
        ARCH_CONFIGS,
        MLA_CONFIGS,
        SPARSE_MLA_CONFIGS,
        REFUSED_MLA_CONFIGS,
        ODD_CONFIGS,
    ):
        if arch in configs:
            return configs[arch]
    return HYBRID_CONFIGS[arch] if arch in HYBRID_CONFIGS else REFUSED_ODD_CONFIGS[arch]
