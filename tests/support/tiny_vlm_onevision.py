"""A tiny random-weight LLaVA-OneVision (SigLIP tower, two-layer projector, AnyRes tiles, Qwen2
text model) built from mlx-vlm's own classes and saved in the Hugging Face layout with its
processor configs, so mlx-vlm's loader and processor read it offline. Its tokenizer is the
vendored real Mistral v0.3 one with ``<image>``, ``<|im_start|>`` and ``<|im_end|>`` added.

AnyRes: an image is one 16-pixel base tile (2x2 patches of 8 pixels) and the tiles of the best
of the grid pinpoints (16x16, 16x32, 32x16) for its shape, unpadded to the image's aspect, each
row of patches closed by the learned ``image_newline`` row: 9 to 18 ``<image>`` rows by shape."""

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
PATCH = 8
PINPOINTS = [[16, 16], [16, 32], [32, 16]]
# Qwen's chat template's shape (an image part renders as <image>), for the tiny model
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def rendered(question: str, images: int) -> str:
    """What CHAT_TEMPLATE renders for one user message of ``images`` images, then ``question``,
    with the generation prompt."""
    return (
        "<s><|im_start|>user\n" + "<image>" * images + question + "<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


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
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
        vision_use_head=False,
    )
    return dict(
        model_type="llava_onevision",
        text_config=text,
        vision_config=vision,
        image_token_index=image_token,
        video_token_index=image_token + 1,
        image_grid_pinpoints=PINPOINTS,
        vision_aspect_ratio="anyres_max_9",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vocab_size=VOCAB_SIZE,
    )


def save_tiny_onevision(path: Path, seed: int = 0) -> Path:
    """The model directory (float32 weights under mlx-vlm's names)."""
    tokenizer = saved_tokenizer(
        path, ["<image>", "<video>", "<|im_start|>", "<|im_end|>"], CHAT_TEMPLATE
    )
    cfg = config(tokenizer.convert_tokens_to_ids("<image>"))
    processor = {
        "processor_class": "LlavaOnevisionProcessor",
        "num_image_tokens": (TILE // PATCH) ** 2,
        "vision_feature_select_strategy": "full",
        "image_token": "<image>",
    }
    write_configs(path, cfg, _image_processor(), processor)
    from mlx_vlm.models import llava_onevision

    model = random_vlm(llava_onevision, cfg, seed)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


def _image_processor() -> dict[str, Any]:
    return {
        "image_processor_type": "LlavaOnevisionImageProcessor",
        "processor_class": "LlavaOnevisionProcessor",
        "size": {"height": TILE, "width": TILE},
        "image_grid_pinpoints": PINPOINTS,
        "do_resize": True,
        **HALF_NORMALIZED,
        "do_pad": True,
        "resample": 3,
    }
