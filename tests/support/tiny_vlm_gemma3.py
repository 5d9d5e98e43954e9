"""A tiny random-weight Gemma 3 (SigLIP vision) VLM built from mlx-vlm's own classes and saved in
the Hugging Face layout with its processor configs, so mlx-vlm's loader and Gemma 3 processor and
mlx-lm's loader all read it offline. Its tokenizer is the vendored real Mistral v0.3 one with
Gemma 3's turn and image tokens added (<start_of_turn>, <end_of_turn>, <start_of_image>,
<image_soft_token>, <end_of_image>), the image ones named as
Gemma's tokenizer config names them, so mlx-vlm's processor expands each image as Gemma's does:
"\\n\\n<start_of_image>" + 16 soft tokens + "<end_of_image>\\n\\n". Two text layers: a
sliding-window one (window 16, shorter than the prompts) and a global one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from macbatch.demo.vision import random_vlm, write_configs
from tests.support.tiny_vlm import saved_tokenizer
from tests.support.tiny_vlm_family import HALF_NORMALIZED

VOCAB_SIZE = 32832
HIDDEN = 64
SOFT_TOKENS = 16  # per image: 8x8 patches average-pooled to 4x4
IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "image_token": "<image_soft_token>",
    "eoi_token": "<end_of_image>",
}
# Gemma 3's chat template's shape (an image part renders as <start_of_image>), for the tiny model
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<start_of_image>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def rendered(question: str, images: int) -> str:
    """What CHAT_TEMPLATE renders for one user message of ``images`` images, then ``question``,
    with the generation prompt."""
    return (
        "<s><start_of_turn>user\n"
        + "<start_of_image>" * images
        + question
        + "<end_of_turn>\n<start_of_turn>model\n"
    )


def config(image_token: int) -> dict[str, Any]:
    text = dict(
        model_type="gemma3_text",
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        query_pre_attn_scalar=16,
        sliding_window=16,
        sliding_window_pattern=2,
        rope_theta=1_000_000.0,  # mlx-lm's name for the global layers' base
        rope_global_base_freq=1_000_000.0,  # mlx-vlm's
        rope_local_base_freq=10_000.0,
        mm_tokens_per_image=SOFT_TOKENS,
        max_position_embeddings=4096,
    )
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=64,
        patch_size=8,
        num_channels=3,
        layer_norm_eps=1e-6,
    )
    return dict(
        model_type="gemma3",
        text_config=text,
        vision_config=vision,
        image_token_index=image_token,
        mm_tokens_per_image=SOFT_TOKENS,
        hidden_size=HIDDEN,
        vocab_size=VOCAB_SIZE,
        pad_token_id=0,
    )


def save_tiny_gemma3(path: Path, seed: int = 0) -> Path:
    """The model directory (float32 weights, ``language_model.*`` / ``vision_tower.*`` /
    ``multi_modal_projector.*`` as mlx-vlm saves them)."""
    from mlx_vlm.models import gemma3

    added = ["<start_of_turn>", "<end_of_turn>", *IMAGE_TOKENS.values()]
    tokenizer = saved_tokenizer(path, added, CHAT_TEMPLATE, named=IMAGE_TOKENS)
    cfg = config(tokenizer.convert_tokens_to_ids(IMAGE_TOKENS["image_token"]))
    processor = {"processor_class": "Gemma3Processor", "image_seq_length": SOFT_TOKENS}
    write_configs(path, cfg, _image_processor(), processor)
    model = random_vlm(gemma3, cfg, seed)
    # mlx-vlm starts the projection at ones: its outputs would be the sums of zero-mean
    # (layer-normed) vectors, rounding noise; a trained one is not
    projector = model.multi_modal_projector
    projector.mm_input_projection_weight = 0.2 * mx.random.normal(
        projector.mm_input_projection_weight.shape
    )
    weights = dict(tree_flatten(model.parameters()))
    # Gemma 3 ties its LM head to the embeddings (mlx-lm's text model always does; mlx-vlm's
    # loader ties it when the checkpoint has no head, as real ones have none)
    del weights["language_model.lm_head.weight"]
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


def _image_processor() -> dict[str, Any]:
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "size": {"height": 64, "width": 64},
        "do_resize": True,
        **HALF_NORMALIZED,
        "do_pan_and_scan": False,
        "resample": 2,
    }
