"""A tiny random-weight Aya Vision (SigLIP tower, pixel shuffle, SwiGLU projector, Cohere 2 text
model: sliding-window layers of window 8, shorter than the prompts, and a global one) built from
mlx-vlm's own classes and saved in the Hugging Face layout with its processor configs, so
mlx-vlm's loader and processor read it offline. Its tokenizer is the vendored real Mistral v0.3
one with Aya Vision's image tokens added.

Tiling (GOT-OCR 2's image processor): an image is cut into 1 or 2 tiles of 16 pixels by its
shape, plus a global tile when it has more than one; each tile 4 ``<|IMG_PATCH|>`` rows (16
patches of 4 pixels, pixel-shuffled by 2): ``<|START_OF_IMG|>TILE_1<|IMG_PATCH|>x4 ...
TILE_GLOBAL<|IMG_PATCH|>x4<|END_OF_IMG|>``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from macbatch.demo.vision import random_vlm, write_configs
from tests.support.tiny_vlm import saved_tokenizer
from tests.support.tiny_vlm_family import HALF_NORMALIZED

VOCAB_SIZE = 32832
TILE = 16
PATCH = 4
IMAGE_TOKENS = ["<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
                "<|IMG_LINE_BREAK|>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"]  # fmt: skip
# Aya Vision's chat template's shape (an image part renders as <image>), for the tiny model
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|START_OF_TURN_TOKEN|>"
    "{{ '<|CHATBOT_TOKEN|>' if message['role'] == 'assistant' else '<|USER_TOKEN|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|END_OF_TURN_TOKEN|>"
    "{% endfor %}{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    "{% endif %}"
)


def rendered(question: str, images: int) -> str:
    """What CHAT_TEMPLATE renders for one user message of ``images`` images, then ``question``,
    with the generation prompt."""
    return (
        "<s><|START_OF_TURN_TOKEN|><|USER_TOKEN|>" + "<image>" * images + question
        + "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )  # fmt: skip


def config(image_token: int) -> dict[str, Any]:
    text = dict(
        model_type="cohere2",
        hidden_size=64,
        head_dim=16,
        num_hidden_layers=4,  # every fourth layer global, the others sliding
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB_SIZE,
        layer_norm_eps=1e-5,
        logit_scale=0.5,
        sliding_window=8,
        sliding_window_pattern=4,
        rope_theta=10_000.0,
        max_position_embeddings=4096,
    )
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
    )
    return dict(
        model_type="aya_vision",
        text_config=text,
        vision_config=vision,
        image_token_index=image_token,
        downsample_factor=2,
        alignment_intermediate_size=128,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vocab_size=VOCAB_SIZE,
        eos_token_id=2,
    )


def save_tiny_aya(path: Path, seed: int = 0) -> Path:
    """The model directory (float32 weights under mlx-vlm's names)."""
    tokenizer = saved_tokenizer(path, IMAGE_TOKENS, CHAT_TEMPLATE)
    cfg = config(tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"))
    processor = {
        "processor_class": "AyaVisionProcessor",
        "patch_size": PATCH,
        "img_size": TILE,
        "downsample_factor": 2,
    }
    write_configs(path, cfg, _image_processor(), processor)
    from mlx_vlm.models import aya_vision

    model = random_vlm(aya_vision, cfg, seed)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


def _image_processor() -> dict[str, Any]:
    return {
        "image_processor_type": "GotOcr2ImageProcessor",
        "processor_class": "AyaVisionProcessor",
        "size": {"height": TILE, "width": TILE},
        "crop_to_patches": True,
        "min_patches": 1,
        "max_patches": 2,
        "do_resize": True,
        **HALF_NORMALIZED,
        "resample": 3,
    }
