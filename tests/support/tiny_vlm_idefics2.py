"""A tiny random-weight Idefics 2 (SigLIP-style tower, perceiver resampler of 3 latents, Mistral
text model) built from mlx-vlm's own classes and saved in the Hugging Face layout with its
processor configs, so mlx-vlm's loader and processor read it offline. Its tokenizer is the
vendored real Mistral v0.3 one with ``<|im_start|>`` added (the processor adds
``<fake_token_around_image>``, ``<image>`` and ``<end_of_utterance>`` itself).

Image splitting is on: an image is four crops and itself, each resampled to 3 ``<image>`` rows
between ``<fake_token_around_image>`` tokens (15 rows an image; the processor adds a space after
a closing one that text follows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from macbatch.demo.vision import random_vlm, write_configs
from tests.support.tiny_vlm import saved_tokenizer
from tests.support.tiny_vlm_family import HALF_NORMALIZED
from tests.support.tiny_vlm_idefics3 import CHAT_TEMPLATE, TURN, rendered

__all__ = ["rendered", "save_tiny_idefics2"]

VOCAB_SIZE = 32832
LATENTS = 3  # rows per crop


def config(image_token: int) -> dict[str, Any]:
    text = dict(
        model_type="mistral",
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
        model_type="idefics2",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        num_channels=3,
        layer_norm_eps=1e-6,
    )
    perceiver = dict(
        model_type="idefics2_perceiver",
        hidden_size=64,  # the text model's, as real configs give it
        rms_norm_eps=1e-5,
        num_key_value_heads=2,
        resampler_depth=2,
        resampler_head_dim=16,
        resampler_n_heads=2,
        resampler_n_latents=LATENTS,
    )
    return dict(
        model_type="idefics2",
        text_config=text,
        vision_config=vision,
        perceiver_config=perceiver,
        image_token_id=image_token,
        vocab_size=VOCAB_SIZE,
        eos_token_id=2,
    )


def save_tiny_idefics2(path: Path, seed: int = 0) -> Path:
    """The model directory (float32 weights under mlx-vlm's names)."""
    tokenizer = saved_tokenizer(
        path, [TURN, "<fake_token_around_image>", "<image>", "<end_of_utterance>"], CHAT_TEMPLATE
    )
    cfg = config(tokenizer.convert_tokens_to_ids("<image>"))
    processor = {"processor_class": "Idefics2Processor", "image_seq_len": LATENTS}
    write_configs(path, cfg, _image_processor(), processor)
    from mlx_vlm.models import idefics2

    model = random_vlm(idefics2, cfg, seed, ("text", "vision", "perceiver"))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


def _image_processor() -> dict[str, Any]:
    return {
        "image_processor_type": "Idefics2ImageProcessor",
        "processor_class": "Idefics2Processor",
        "do_resize": True,
        "size": {"shortest_edge": 16, "longest_edge": 32},
        "do_image_splitting": True,
        **HALF_NORMALIZED,
        "do_pad": True,
        "resample": 2,
    }
