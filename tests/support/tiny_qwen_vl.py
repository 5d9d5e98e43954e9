"""A tiny random-weight Qwen2-VL, Qwen2.5-VL, Qwen3-VL (with DeepStack features) or Qwen3.5 (a
hybrid: Gated DeltaNet and attention layers) built from mlx-vlm's own classes and saved in the
Hugging Face layout with its image processor config, so mlx-vlm's loader and processor and
mlx-lm's loader all read it offline. Its tokenizer is the vendored real Qwen3 one (it has Qwen
VL's ``<|vision_start|>`` / ``<|image_pad|>`` / ``<|vision_end|>`` tokens), its vocabulary cut to
the tokenizer's size rounded up so the embedding stays small."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from tests.support.real_tokenizers import TOKENIZERS

VOCAB_SIZE = 151680  # the tokenizer's 151669 tokens, rounded up
PATCH = 14
MERGE = 2
WEIGHT_SCALE = 4.0
# Qwen VL's own template shape: an image part renders as a vision span with one image pad.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def config(tokens: dict[str, int], family: str = "qwen2_5_vl") -> dict[str, Any]:
    if family == "qwen3_5":
        return _qwen3_5_config(tokens)
    if family == "qwen3_vl":
        return _qwen3_vl_config(tokens)
    text = dict(
        model_type=family,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        # head_dim 16: 8 frequencies, 2 temporal, 3 height, 3 width
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        tie_word_embeddings=True,
    )
    if family == "qwen2_vl":  # its tower: full attention, embed_dim wide, mlp_ratio
        vision = dict(
            model_type=family,
            depth=2,
            embed_dim=32,
            hidden_size=32,
            num_heads=2,
            mlp_ratio=2,
            patch_size=PATCH,
            spatial_patch_size=PATCH,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
            in_channels=3,
        )
        return _with_tokens(family, text, vision, tokens)
    vision = dict(
        model_type="qwen2_5_vl",
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=32,
        num_heads=2,
        patch_size=PATCH,
        spatial_patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
        window_size=56,
        fullatt_block_indexes=[1],
        in_channels=3,
    )
    return _with_tokens("qwen2_5_vl", text, vision, tokens)


def _qwen3_5_config(tokens: dict[str, int]) -> dict[str, Any]:
    text = dict(
        model_type="qwen3_5",
        hidden_size=32,
        num_hidden_layers=4,  # Gated DeltaNet, attention, Gated DeltaNet, attention
        full_attention_interval=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        # rotary dims 8 of 16 (partial): 4 frequencies, interleaved T H W T
        rope_parameters={
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
        },
    )
    return _with_tokens("qwen3_5", text, _qwen3_vision("qwen3_5", []), tokens)


def _qwen3_vl_config(tokens: dict[str, int]) -> dict[str, Any]:
    text = dict(
        model_type="qwen3_vl",
        hidden_size=32,
        num_hidden_layers=3,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        # head_dim 16: 8 frequencies, interleaved T H W T H W T T (width's third past the end)
        rope_scaling={
            "rope_type": "default",
            "mrope_section": [3, 2, 3],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=True,
    )
    # DeepStack: the tower's layers 0 and 1 feed the first two text layers
    return _with_tokens("qwen3_vl", text, _qwen3_vision("qwen3_vl", [0, 1]), tokens)


def _qwen3_vision(family: str, deepstack: list[int]) -> dict[str, Any]:
    """Qwen3.5's and Qwen3-VL's vision tower (one more layer than the DeepStack taps)."""
    return dict(
        model_type=family,
        depth=max(2, len(deepstack) + 1),
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=32,
        num_heads=2,
        patch_size=PATCH,
        spatial_patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
        num_position_embeddings=16,
        in_channels=3,
        deepstack_visual_indexes=deepstack,
    )


def _with_tokens(
    family: str, text: dict[str, Any], vision: dict[str, Any], tokens: dict[str, int]
) -> dict[str, Any]:
    return dict(
        model_type=family,
        text_config=text,
        vision_config=vision,
        image_token_id=tokens["<|image_pad|>"],
        video_token_id=tokens["<|video_pad|>"],
        vision_start_token_id=tokens["<|vision_start|>"],
        vision_end_token_id=tokens["<|vision_end|>"],
        vision_token_id=tokens["<|vision_pad|>"],
        vocab_size=VOCAB_SIZE,
        **{k: v for k, v in text.items() if k not in ("model_type", "vocab_size")},
    )


def save_tiny_qwen_vl(path: Path, seed: int = 0, family: str = "qwen2_5_vl") -> Path:
    """The model directory (float32 weights as mlx-vlm saves them)."""
    import importlib

    from mlx_vlm.utils import update_module_configs

    module = importlib.import_module(f"mlx_vlm.models.{family}")
    from transformers import AutoTokenizer

    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZERS / "qwen3" / name, path / name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    names = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    tokens = {n: tokenizer.convert_tokens_to_ids(n) for n in [*names, "<|vision_pad|>"]}
    cfg = config(tokens, family)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645}))
    (path / "preprocessor_config.json").write_text(json.dumps(_image_processor(family)))
    mx.random.seed(seed)
    model_config = update_module_configs(
        module.ModelConfig.from_dict(cfg), module, cfg, ["text", "vision"]
    )
    model = module.Model(model_config)
    model.set_dtype(mx.float32)
    # random weights at their default scale collapse to one repeated token; larger ones make
    # greedy ids depend on every position (a wrong M-RoPE position changes them)
    model.update(tree_map(lambda w: w * WEIGHT_SCALE if w.ndim == 2 else w, model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


def _image_processor(family: str) -> dict[str, Any]:
    processor = {
        "qwen2_vl": "Qwen2VLProcessor",
        "qwen2_5_vl": "Qwen2_5_VLProcessor",
        "qwen3_vl": "Qwen3VLProcessor",
        "qwen3_5": "Qwen3VLProcessor",
    }[family]
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor,
        "patch_size": PATCH,
        "merge_size": MERGE,
        "temporal_patch_size": 2,
        "min_pixels": 28 * 28,
        "max_pixels": 28 * 28 * 16,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }
