"""A tiny random-weight InternVL chat (InternViT tower, pixel shuffle, MLP projector, Qwen2 text
model) built from mlx-vlm's own classes and saved in the layout mlx-vlm's ``internvl_chat``
reads, its processor settings in config.json (``force_image_size``, ``max_dynamic_patch``,
``use_thumbnail``) as InternVL checkpoints keep them, so mlx-vlm's loader and processor read it
offline. Its tokenizer is the vendored real Mistral v0.3 one with ``<img>``, ``</img>``,
``<IMG_CONTEXT>``, ``<|im_start|>`` and ``<|im_end|>`` added; the chat template is
LLaVA-OneVision's tiny one (Qwen's shape, an image part rendering as ``<image>``).

Dynamic tiling: an image is cut into 1 or 2 tiles of 16 pixels (the grid closest to its aspect)
plus a thumbnail when it has 2, each tile 4 ``<IMG_CONTEXT>`` rows (16 patches of 4 pixels,
pixel-shuffled by 2): ``<img><IMG_CONTEXT>x4 (or x12)</img>``, so the row count depends on the
image's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from macbatch.demo.vision import random_vlm
from tests.support.tiny_vlm import saved_tokenizer
from tests.support.tiny_vlm_onevision import CHAT_TEMPLATE, rendered

__all__ = ["rendered", "save_tiny_internvl"]

VOCAB_SIZE = 32832
TILE = 16
PATCH = 4
IMAGE_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<|im_start|>", "<|im_end|>"]


def config(image_token: int) -> dict[str, Any]:
    text = dict(
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
    )
    vision = dict(
        model_type="intern_vit_6b",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
    )
    return dict(
        model_type="internvl_chat",
        text_config=text,
        vision_config=vision,
        image_token_index=image_token,
        downsample_ratio=0.5,
        force_image_size=TILE,
        min_dynamic_patch=1,
        max_dynamic_patch=2,
        use_thumbnail=True,
        vocab_size=VOCAB_SIZE,
        eos_token_id=2,
    )


def save_tiny_internvl(path: Path, seed: int = 0) -> Path:
    """The model directory (float32 weights under mlx-vlm's names)."""
    tokenizer = saved_tokenizer(path, IMAGE_TOKENS, CHAT_TEMPLATE)
    cfg = config(tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"))
    # no processor files: InternVL's processor reads its settings from config.json
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    from mlx_vlm.models import internvl_chat

    model = random_vlm(internvl_chat, cfg, seed)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path
