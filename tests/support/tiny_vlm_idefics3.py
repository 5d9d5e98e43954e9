"""A tiny random-weight Idefics 3 or SmolVLM (the same model code: SigLIP tower, pixel shuffle,
one linear projection) built from mlx-vlm's own classes and saved in the Hugging Face layout with
its processor configs, so mlx-vlm's loader and processor read it offline. Its tokenizer is the
vendored real Mistral v0.3 one with the image tokens added (``<fake_token_around_image>``,
``<image>``, ``<global-img>``, ``<row_R_col_C>``, ``<end_of_utterance>``, ``<|im_start|>``).

Image splitting is on: an image is resized to a longest edge of 64, cut into 32-pixel tiles
(2x2 for the test images, 2x1 past an aspect of 2) and followed by the whole image at 32
pixels, each tile one ``<image>`` row (4 patches of 16 pixels, pixel-shuffled by 2), so the
row count depends on the image's shape: ``<fake_token_around_image><row_1_col_1><image> ...
<fake_token_around_image><global-img><image><fake_token_around_image>``; SEQ_LEN rows a tile."""

from __future__ import annotations

import importlib
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from macbatch.demo.vision import random_vlm, write_configs
from tests.support.tiny_vlm import saved_tokenizer
from tests.support.tiny_vlm_family import HALF_NORMALIZED

VOCAB_SIZE = 32832
TILE = 32  # pixels: the tower's image size and the processor's tile
PATCH = 16
SEQ_LEN = (TILE // PATCH) ** 2 // 4  # rows per tile after the 2x pixel shuffle
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
TURN = "<|im_start|>"  # SmolVLM's template opens with it (a special token: no prefix space)
GRID_TOKENS = [f"<row_{r}_col_{c}>" for r in range(1, 3) for c in range(1, 3)]
# SmolVLM's chat template's shape (an image part renders as <image>), for the tiny model
CHAT_TEMPLATE = (
    "{{ bos_token }}<|im_start|>{% for message in messages %}"
    "{{ message['role'] | capitalize }}:{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
PROCESSORS = {"idefics3": "Idefics3", "smolvlm": "SmolVLM"}


def rendered(question: str, images: int) -> str:
    """What CHAT_TEMPLATE renders for one user message of ``images`` images, then ``question``,
    with the generation prompt."""
    return "<s><|im_start|>User:" + "<image>" * images + question + "<end_of_utterance>\nAssistant:"


def config(family: str, image_token: int) -> dict[str, Any]:
    text = dict(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB_SIZE,
        rope_theta=10_000.0,
        max_position_embeddings=4096,
    )
    vision = dict(
        model_type="idefics3_vision" if family == "idefics3" else "smolvlm_vision",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
        num_channels=3,
        layer_norm_eps=1e-6,
    )
    return dict(
        model_type=family,
        text_config=text,
        vision_config=vision,
        image_token_id=image_token,
        scale_factor=2,
        vocab_size=VOCAB_SIZE,
    )


def save_tiny_idefics3(path: Path, seed: int = 0, family: str = "idefics3") -> Path:
    """The model directory (float32 weights under mlx-vlm's names)."""
    tokenizer = saved_tokenizer(path, [TURN, *IMAGE_TOKENS, *GRID_TOKENS], CHAT_TEMPLATE)
    cfg = config(family, tokenizer.convert_tokens_to_ids("<image>"))
    name = PROCESSORS[family]
    processor = {"processor_class": f"{name}Processor", "image_seq_len": SEQ_LEN}
    write_configs(path, cfg, _image_processor(name), processor)
    model = random_vlm(importlib.import_module(f"mlx_vlm.models.{family}"), cfg, seed)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


save_tiny_smolvlm = partial(save_tiny_idefics3, family="smolvlm")


def _image_processor(name: str) -> dict[str, Any]:
    return {
        "image_processor_type": f"{name}ImageProcessor",
        "processor_class": f"{name}Processor",
        "do_resize": True,
        "size": {"longest_edge": 2 * TILE},
        "max_image_size": {"longest_edge": TILE},
        "do_image_splitting": True,
        **HALF_NORMALIZED,
        "do_pad": True,
        "resample": 1,
    }
