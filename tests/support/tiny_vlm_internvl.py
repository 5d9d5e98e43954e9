"""A tiny random-weight InternVL, as mlx-vlm's ``internvl_chat`` (InternVL 2.5's remote-code
layout: InternViT tower, Qwen2 text model) or ``internvl`` (InternVL 3's Hugging Face layout:
its own tower, Qwen3 text model) reads it: pixel shuffle and an MLP projector, built from
mlx-vlm's own classes and saved in the layout mlx-vlm reads, the processor settings in
config.json (``force_image_size``, ``max_dynamic_patch``, ``use_thumbnail``) as InternVL
checkpoints keep them (``internvl``: its rows per tile in processor_config.json too), so
mlx-vlm's loader and processor read it offline. Its tokenizer is the vendored real Mistral v0.3
one with ``<img>``, ``</img>``, ``<IMG_CONTEXT>``, ``<|im_start|>`` and ``<|im_end|>`` added;
the chat template is LLaVA-OneVision's tiny one (Qwen's shape, an image part as ``<image>``).

Dynamic tiling: an image is cut into 1 or 2 tiles of 16 pixels (the grid closest to its aspect)
plus a thumbnail when it has 2, each tile 4 ``<IMG_CONTEXT>`` rows (16 patches of 4 pixels,
pixel-shuffled by 2): ``<img><IMG_CONTEXT>x4 (or x12)</img>``, so the row count depends on the
image's shape."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from macbatch.demo.vision import random_vlm
from tests.support.tiny import randomize
from tests.support.tiny_vlm import saved_tokenizer
from tests.support.tiny_vlm_onevision import CHAT_TEMPLATE, rendered

__all__ = ["rendered", "save_tiny_internvl", "save_tiny_internvl3"]

VOCAB_SIZE = 32832
TILE = 16
PATCH = 4
ROWS_PER_TILE = (TILE // PATCH) ** 2 // 4
IMAGE_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<|im_start|>", "<|im_end|>"]
# family -> (its text model, its tower's model_type, the config key of the image token)
LAYOUTS = {
    "internvl_chat": ("qwen2", "intern_vit_6b", "image_token_index"),
    "internvl": ("qwen3", "intern_vit", "image_token_id"),
}


def config(family: str, image_token: int) -> dict[str, Any]:
    text_type, tower, token_key = LAYOUTS[family]
    text = dict(
        model_type=text_type,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
    )
    vision = dict(
        model_type=tower,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
    )
    return {
        "model_type": family,
        "text_config": text,
        "vision_config": vision,
        token_key: image_token,
        "downsample_ratio": 0.5,
        "force_image_size": TILE,
        "min_dynamic_patch": 1,
        "max_dynamic_patch": 2,
        "use_thumbnail": True,
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": 2,
    }


def save_tiny_internvl(path: Path, seed: int = 0, family: str = "internvl_chat") -> Path:
    """The model directory (float32 weights under mlx-vlm's names)."""
    tokenizer = saved_tokenizer(path, IMAGE_TOKENS, CHAT_TEMPLATE)
    cfg = config(family, tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"))
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (path / "processor_config.json").write_text(json.dumps({"image_seq_length": ROWS_PER_TILE}))
    from mlx_vlm.models import internvl, internvl_chat

    model = random_vlm({"internvl": internvl, "internvl_chat": internvl_chat}[family], cfg, seed)
    # InternVL 3's tower makes its class token and position embeddings as zeros
    randomize(model, ("cls_token", "position_embeddings"), 0.3)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


save_tiny_internvl3 = partial(save_tiny_internvl, family="internvl")
