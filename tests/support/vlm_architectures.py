"""Tiny random configs of mlx-vlm's VLMs whose language model is mlx-vlm's own code, derived as
``architectures.py`` derives mlx-lm's (tests/engine/model/test_vlm_language_models.py builds them):
each of the family's config classes (``TextConfig``, ``VisionConfig``, a projector's ...) gets a
tiny value for every field a rule names (the text model's sizes, a one-layer tower, the bridge
between them), then the family's row of ``OVERRIDES`` for what no rule guesses."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from tests.support.tiny import HYBRID_CONFIGS, SPECIAL_TOKENS, VOCAB_SIZE

# the text model: two layers of the parity tests' sizes, four small experts, small MLA rows
_TEXT: dict[str, Any] = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=VOCAB_SIZE, max_position_embeddings=4096,
    rms_norm_eps=1e-5, layer_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False,
    moe_intermediate_size=32, n_routed_experts=4, num_experts=4, num_local_experts=4,
    moe_num_experts=4, num_experts_per_tok=2, moe_k=2, n_shared_experts=1,
    shared_expert_intermediate_size=32, first_k_dense_replace=1, norm_topk_prob=True,
    n_group=1, topk_group=1, routed_scaling_factor=1.0, use_qk_norm=False,
    kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
    partial_rotary_factor=0.5, sliding_window=8,
    n_embd=64, n_layer=2, n_head=4, n_heads=4, d_model=64, num_layers=2, dim=64, n_kv_heads=2,
    ffn_hidden_size=96,
)  # fmt: skip
# the vision tower: one layer of width 32 on a 28-pixel image of two 14-pixel patches a side
_TOWER: dict[str, Any] = dict(
    hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2,
    image_size=28, patch_size=14, projection_dim=32, depth=1, embed_dim=32, num_heads=2,
    num_layers=1, width=32, layers=1, heads=2, out_hidden_size=64, mlp_ratio=2.0,
)  # fmt: skip
# the parts between them (projectors, resamplers): the tower's width in, the text's out
_BRIDGE: dict[str, Any] = dict(_TOWER, input_dim=32, n_embed=64, mm_hidden_size=32, mlp_ratio=2)
_RULES = {"text": _TEXT, "vision": _TOWER}

# the text model's fields, for the families whose config holds them at its top level
_FLAT: dict[str, Any] = {
    k: _TEXT[k]
    for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta")
}  # fmt: skip
_PADDLE_TEXT: dict[str, Any] = dict(
    _FLAT, hidden_act="silu", use_bias=False, pad_token_id=0, bos_token_id=1,
    vision_end_token_id=7,
    rope_scaling={"rope_type": "default", "type": "default", "mrope_section": [2, 3, 3]},
)  # fmt: skip
# ERNIE 4.5 VL's: a dense first layer, then text and multimodal expert groups beside a shared
# expert; 3-D RoPE sections of a 16-wide head
_ERNIE_TEXT: dict[str, Any] = dict(
    _FLAT, moe_layer_start_index=1, moe_layer_end_index=1, moe_num_experts=[4, 4],
    moe_intermediate_size=[32, 32], moe_k=2, moe_num_shared_experts=1, mrope_section=[3, 3, 2],
    pixel_hidden_size=32,
)  # fmt: skip
# Qwen3-Omni's thinker (and its talker, whose config it parses and leaves unbuilt): a dense
# first layer, then experts; interleaved M-RoPE sections of a 16-wide head
_OMNI_TEXT: dict[str, Any] = dict(
    _TEXT, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[0],
    rope_scaling={"type": "default", "mrope_section": [3, 3, 2], "interleaved": True},
)  # fmt: skip
_OMNI_THINKER: dict[str, Any] = dict(
    text_config=_OMNI_TEXT,
    vision_config=dict(_TOWER, out_hidden_size=64, num_position_embeddings=4,
                       deepstack_visual_indexes=[0]),
    audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                      num_hidden_layers=1, output_dim=64, downsample_hidden_size=16),
)  # fmt: skip
_ZAYA_TEXT: dict[str, Any] = dict(_TEXT, num_query_groups=2, zaya_mlp_expansion=16)

# Molmo 2's tower and the adapter that pools its layers' features into the text model's rows
_MOLMO2_VIT: dict[str, Any] = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, head_dim=16, image_num_pos=4, image_default_input_size=[28, 28],
)  # fmt: skip
_MOLMO2_ADAPTER: dict[str, Any] = dict(
    hidden_size=32, intermediate_size=64, text_hidden_size=64, num_attention_heads=2,
    num_key_value_heads=2, head_dim=16, vit_layers=[-1],
)  # fmt: skip

# family -> part ("text", "vision", another ``<part>_config``, or "top": the config itself) ->
# fields no rule gives
OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    # four layers: its every fourth is global, the others sliding
    "aya_vision": {
        "text": {"num_hidden_layers": 4},
        "vision": {"model_type": "siglip_vision_model"},
    },
    "cohere_compass": {"vision": {"model_type": "cohere_compass_vision"}},
    "dots_ocr": {},
    "deepseekocr": {"vision": {"model_type": "vision"}},
    "deepseek_vl_v2": {"vision": {"model_type": "vision"}},
    # DeepSeek-OCR 2: its decoder's attention without MLA (no-nope heads: LlamaAttention, as its
    # real checkpoints'), its Qwen2 encoder 14 heads of 4 wide (the encoder's 24 layers and its
    # SAM tower's size are fixed in its code: built in memory, BUILT_IN_MEMORY)
    "deepseekocr_2": {
        "text": {"model_type": "deepseek_v2", "qk_nope_head_dim": 0, "qk_rope_head_dim": 0},
        "vision": {"model_type": "vision", "width": {"qwen2-0-5b": {"dim": 56}}},
        "projector": {"input_dim": 56},
    },
    "molmo2": {"vision": {"vit_config": _MOLMO2_VIT, "adapter_config": _MOLMO2_ADAPTER}},
    # its rotary dims are 32: heads of 32
    "moondream3": {"text": {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32}},
    # Janus: a one-tower SigLIP and a two-layer MLP projector
    "multi_modality": {
        "text": {"model_type": "llama"},
        "vision": {"model_type": "vision", "cls": "CLIPVisionTower", "params": {}},
        "projector": {"model_type": "mlp", "cls": "MlpProjector",
                      "params": {"projector_type": "mlp_gelu", "depth": 2}},
    },
    "got": {"top": _FLAT},
    # their text fields at the top level (Youtu-VL's experts among them)
    "youtu_vl": {"top": _TEXT},
    "falcon_ocr": {"top": _FLAT},
    # Nemotron-H's Mamba 2, attention and MLP layers (mlx-lm's tiny nemotron_h)
    "nemotron_h_nano_omni": {"text": HYBRID_CONFIGS["nemotron_h"], "top": {"vit_hidden_size": 32,
                             "projector_hidden_size": 64}},
    # Qwen3.5's Gated DeltaNet and attention layers under a document-layout model
    "indic_ocr": {"text": HYBRID_CONFIGS["qwen3_5"]},
    # its Q-Former's heads are 64 wide
    "granite4_vision": {"vision": {"hidden_size": 64}},
    "glm4v_moe": {},
    "glm_ocr": {},
    "internvl": {"text": {"tie_word_embeddings": False}},
    "llava_bunny": {
        "top": {"auto_map": {}, "hidden_size": 64, "mm_hidden_size": 32},
        "vision": {"model_type": "siglip_vision_model"},
    },
    # its tower's rotary halves split 4:6:6 in multiples of 16: heads of 64
    "mage_vl": {"vision": {"hidden_size": 128, "text_hidden_size": 64}},
    # its text model reads the config's top level, whose defaults are tuples where numbers
    # belong; M-RoPE sections of a 16-wide head
    "paddleocr_vl": {"top": _PADDLE_TEXT, "text": _PADDLE_TEXT},
    # the text model's fields sit in the config itself
    "phi3_v": {"top": _FLAT},
    "plamo2vl": {"text": {"model_type": "plamo2"}},
    "smolvlm": {},
    "moondream2": {},
    "phi4_siglip": {"vision": {"model_type": "siglip2_vision_model"}},
    # Qwen3.5's Gated DeltaNet between attention layers (mlx-lm's tiny qwen3_5), dense or MoE
    "minicpmv4_6": {"text": HYBRID_CONFIGS["qwen3_5"]},
    # its image and video placeholders: ids its prompts never hold
    "minicpmv4_7": {
        "text": dict(HYBRID_CONFIGS["qwen3_5"], model_type="qwen3_5_moe_text", num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=32, image_token_id=1, video_token_id=2),
        "top": {"image_token_id": 1, "video_token_id": 2},
    },
    "idefics2": {},
    "jina_vlm": {},
    "fastvlm": {},
    "glm4v": {},
    "idefics3": {},
    "locateanything": {"vision": {"model_type": "moonvit"}},
    # MiMo-V2-Flash's text model: a full-attention and a sliding-window layer (sinks on the
    # window's), a dense and a MoE MLP
    "mimo_v2": {"text": {"hybrid_layer_pattern": [0, 1], "moe_layer_freq": [0, 1],
                         "v_head_dim": 16, "swa_head_dim": 16, "swa_v_head_dim": 16,
                         "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
                         "sliding_window_size": 8, "partial_rotary_factor": 0.5,
                         "routed_scaling_factor": 1.0, "moe_router_dtype": "float32"}},
    # XD-RoPE's four sections of a 16-wide head, its QK norms on
    # its text fields at the top level too (its from_dict reads them there)
    "ernie4_5_moe_vl": {"top": _ERNIE_TEXT, "text": _ERNIE_TEXT},
    "qwen3_omni_moe": {"thinker": _OMNI_THINKER, "talker": {"text_config": _OMNI_TEXT},
                       "top": {"enable_audio_output": False}},
    # Phi-4-multimodal: its text fields at the top level, RoPE on three quarters of each 16-wide
    # head, LongRoPE as its real checkpoints have it (4,096 original positions of 131,072; the
    # short factors, which every prompt here is rotated by, differ from 1 and from the long)
    "phi4mm": {"top": dict(_FLAT, partial_rotary_factor=0.75, max_position_embeddings=131072,
        original_max_position_embeddings=4096, rope_scaling={"type": "longrope",
        "short_factor": [1.0, 1.4, 2.2, 3.5, 5.0, 8.0],
        "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]},
        audio_processor={"config": dict(
        attention_dim=32, attention_heads=2, num_blocks=1, linear_units=64, ext_pw_out_channel=32,
        depthwise_seperable_out_channel=32, conv_channels=32)})},
    # refused (its attention's short convolutions keep state beside the K/V): its text fields at
    # the top level too, its CCA's query groups its K/V heads
    "zaya1_vl": {"top": _ZAYA_TEXT, "text": _ZAYA_TEXT},
    "hunyuan_vl": {"text": {"use_qk_norm": True, "rope_scaling": {
        "type": "xdrope", "alpha": 1000.0, "factor": 1.0, "xdrope_section": [2, 2, 2, 2]}}},
}  # fmt: skip

# families whose tiny model is too big to save in a test (parts of it sized by its code, not its
# config): the parity test builds them in memory -> why
BUILT_IN_MEMORY: dict[str, str] = {
    "deepseekocr_2": "its code builds a SAM ViT-B tower of its own sizes (about 90M parameters) "
    "and a 24-layer Qwen2 encoder, whatever its config says",
}


def _config_classes(module: Any) -> dict[str, type]:
    """The family's ``<part>_config`` fields and their config classes."""
    config = module.ModelConfig
    try:
        hints = typing.get_type_hints(config)
    except NameError:  # a forward reference only its module resolves
        hints = {}
    classes = {}
    for f in dataclasses.fields(config):
        if not f.name.endswith("_config"):
            continue
        cls = hints.get(f.name)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            cls = getattr(module, f.name.removesuffix("_config").title() + "Config", None)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            classes[f.name] = cls
    return classes


def _filled(cls: type, rules: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given``, and each other field of ``cls`` a rule names."""
    names = [f.name for f in dataclasses.fields(cls)]
    return {**{n: rules[n] for n in names if n in rules}, **given}


def _model_type(cls: type, family: str) -> dict[str, str]:
    """The family's name as the ``model_type`` of a config class that requires one."""
    required = [
        f for f in dataclasses.fields(cls)
        if f.name == "model_type" and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]  # fmt: skip
    return {"model_type": family} if required else {}


def vlm_config(family: str) -> dict[str, Any]:
    """The tiny config.json of ``family`` (a key of ``OVERRIDES``)."""
    from mlx_vlm.utils import get_model_and_args

    module, _ = get_model_and_args({"model_type": family})
    rows = OVERRIDES[family]
    config: dict[str, Any] = dict(model_type=family, vocab_size=VOCAB_SIZE)
    for field, cls in _config_classes(module).items():
        part = field.removesuffix("_config")
        given = {**_model_type(cls, family), **rows.get(part, {})}
        config[field] = _filled(cls, _RULES.get(part, _BRIDGE), given)
    config.update(rows.get("top", {}))
    config["eos_token_id"] = SPECIAL_TOKENS.index("<|im_end|>")
    return config
