"""A tiny random-weight Gemma 4 VLM built from mlx-vlm's own classes and saved in the Hugging Face
layout with its processor config, so mlx-vlm's loader and Gemma 4 processor and mlx-lm's loader
all read it offline. Its tokenizer is the vendored real Mistral v0.3 one with Gemma 4's turn and
image tokens added (``<|turn>``, ``<turn|>``, ``<|image>``, ``<|image|>``, ``<image|>``), the image
ones named as Gemma 4's tokenizer config names them, so mlx-vlm's processor expands each image as
Gemma 4's does: ``<|image>`` + one ``<|image|>`` per soft token + ``<image|>``.

Four text layers of hidden 48 (sliding, full, sliding, full; the last two reuse the first two's
K/V), per-layer inputs, a sliding window of 6 (shorter than an image's up to 9 soft tokens, so a
window layer's image row sees past its window only through the image's bidirectional block),
and ``use_bidirectional_attention: "vision"``. Vision: 4-pixel patches pooled 3x3, at most 9 soft
tokens per image (1 to 9, by the image's shape)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from macbatch.demo.vision import random_vlm, write_configs
from tests.support.tiny_vlm import saved_tokenizer

VOCAB_SIZE = 32832
HIDDEN = 48  # sqrt(48) is not a power of two: image rows must skip the scale exactly
SOFT_TOKENS = 9  # at most, per image
WINDOW = 6
WEIGHT_SCALE = 2.0
EMBED_SCALE = 0.1
IMAGE_TOKENS = {"boi_token": "<|image>", "image_token": "<|image|>", "eoi_token": "<image|>"}
# Gemma 4's chat template's shape (an image part renders as <|image|>), for the tiny model
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|image|>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<turn|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def rendered(question: str, images: int) -> str:
    """What CHAT_TEMPLATE renders for one user message of ``images`` images, then ``question``,
    with the generation prompt."""
    return "<s><|turn>user\n" + "<|image|>" * images + question + "<turn|>\n<|turn>model\n"


def config(tokens: dict[str, int], bidirectional: bool = True) -> dict[str, Any]:
    text = dict(
        model_type="gemma4_text",
        hidden_size=HIDDEN,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        num_kv_shared_layers=2,  # layers 2 and 3 reuse the K/V of layers 0 and 1
        hidden_size_per_layer_input=16,
        vocab_size=VOCAB_SIZE,
        vocab_size_per_layer_input=VOCAB_SIZE,
        rms_norm_eps=1e-6,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"] * 2,
        max_position_embeddings=4096,
        # as real checkpoints spell them out (mlx-lm's and mlx-vlm's defaults differ)
        rope_parameters={
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
        },
        use_bidirectional_attention="vision" if bidirectional else None,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=16,
        patch_size=4,
        pooling_kernel_size=3,
        position_embedding_size=64,
        default_output_length=SOFT_TOKENS,
    )
    return dict(
        model_type="gemma4",
        text_config=text,
        vision_config=vision,
        image_token_id=tokens["image_token"],
        boi_token_id=tokens["boi_token"],
        eoi_token_id=tokens["eoi_token"],
        audio_token_id=VOCAB_SIZE - 1,  # no audio tower; an id no prompt holds
        vision_soft_tokens_per_image=SOFT_TOKENS,
        hidden_size=HIDDEN,
        vocab_size=VOCAB_SIZE,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def save_tiny_gemma4(path: Path, seed: int = 0, bidirectional: bool = True) -> Path:
    """The model directory (float32 weights, ``language_model.model.*`` / ``vision_tower.*`` /
    ``embed_vision.*`` as mlx-vlm saves them); ``bidirectional`` False: the same model with
    ``use_bidirectional_attention`` unset (every image row causal in mlx-vlm too)."""
    from mlx_vlm.models import gemma4

    added = ["<|turn>", "<turn|>", *IMAGE_TOKENS.values()]
    tokenizer = saved_tokenizer(path, added, CHAT_TEMPLATE, named=IMAGE_TOKENS)
    tokens = {k: tokenizer.convert_tokens_to_ids(v) for k, v in IMAGE_TOKENS.items()}
    cfg = config(tokens, bidirectional)
    image_processor = {
        "processor_class": "Gemma4Processor",
        "patch_size": 4,
        "max_soft_tokens": SOFT_TOKENS,
        "pooling_kernel_size": 3,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": False,
    }
    write_configs(path, cfg, image_processor, {"processor_class": "Gemma4Processor"})
    (path / "processor_config.json").unlink()  # mlx-vlm's processor reads the flat one
    model = random_vlm(gemma4, cfg, seed)
    # random weights at their default scale give near-uniform logits; larger ones make greedy
    # ids depend on every position (image rows included)
    model.update(tree_map(lambda w: w * WEIGHT_SCALE if w.ndim == 2 else w, model.parameters()))
    # and a small token embedding: at mlx-vlm's scale (times sqrt(hidden)) it outweighs every
    # layer's normed output, and each row's argmax is its own input token
    text = model.language_model.model
    text.embed_tokens.weight = text.embed_tokens.weight * EMBED_SCALE
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path
