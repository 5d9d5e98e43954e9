"""Tiny random configs of mlx-vlm's VLMs whose language model is mlx-vlm's own code, derived as
``architectures.py`` derives mlx-lm's (tests/engine/model/test_vlm_language_models.py builds them):
each of the family's config classes (``TextConfig``, ``VisionConfig``, a projector's ...) gets a
tiny value for every field a rule names (the text model's sizes, a one-layer tower, the bridge
between them), then the family's row of ``OVERRIDES`` for what no rule guesses."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from tests.support.tiny import SPECIAL_TOKENS, VOCAB_SIZE

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
_BRIDGE: dict[str, Any] = dict(_TOWER, input_dim=32, n_embed=64, mm_hidden_size=32)
_RULES = {"text": _TEXT, "vision": _TOWER}

# family -> part ("text", "vision", another ``<part>_config``, or "top": the config itself) ->
# fields no rule gives
OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    # four layers: its every fourth is global, the others sliding
    "aya_vision": {
        "text": {"num_hidden_layers": 4},
        "vision": {"model_type": "siglip_vision_model"},
    },
    "dots_ocr": {},
    "fastvlm": {},
    "glm4v": {},
    "idefics3": {},
    "locateanything": {"vision": {"model_type": "moonvit"}},
}  # fmt: skip


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


def vlm_config(family: str) -> dict[str, Any]:
    """The tiny config.json of ``family`` (a key of ``OVERRIDES``)."""
    from mlx_vlm.utils import get_model_and_args

    module, _ = get_model_and_args({"model_type": family})
    rows = OVERRIDES[family]
    config: dict[str, Any] = dict(model_type=family, vocab_size=VOCAB_SIZE)
    for field, cls in _config_classes(module).items():
        part = field.removesuffix("_config")
        typed = (
            {"model_type": family}
            if "model_type" in {f.name for f in dataclasses.fields(cls)}
            else {}
        )
        config[field] = _filled(cls, _RULES.get(part, _BRIDGE), {**typed, **rows.get(part, {})})
    config.update(rows.get("top", {}))
    config["eos_token_id"] = SPECIAL_TOKENS.index("<|im_end|>")
    return config
