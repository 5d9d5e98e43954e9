"""The config of a tiny Phi-4-SigLIP (``model_type: phi4-siglip``, as its checkpoints say), which
mlx-vlm's own classes build with random weights (``random_vlm``): a 2-layer Siglip2 (NaFlex) tower
of 4-pixel patches, a two-layer GELU projector, a 2-layer text model of 64 wide. The tests give it
the vendored real Mistral v0.3 tokenizer with ``<|im_start|>`` and ``<|im_end|>`` added and
LLaVA-OneVision's tiny chat template (an image part as ``<image>``, which the processor tokenizes as
one id, -200, per image). No checkpoint is saved: mlx-vlm's loader cannot build its processor
without PyTorch (tests/vision/test_phi4_siglip_images.py).

The processor's Siglip2 image processor resizes an image to at most 16 patches and pads it to 16:
an image's rows are its real patches (``pixel_attention_mask``), so their count depends on its
shape."""

from __future__ import annotations

from typing import Any

from tests.support.tiny_vlm_onevision import rendered

__all__ = ["MAX_PATCHES", "config", "rendered"]

VOCAB_SIZE = 32832
MAX_PATCHES = 16


def config() -> dict[str, Any]:
    text = dict(
        model_type="phi4-siglip",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB_SIZE,
        rope_theta=10_000.0,
    )
    vision = dict(
        model_type="siglip2_vision_model",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        patch_size=4,
        num_patches=MAX_PATCHES,
    )
    return {
        "model_type": "phi4-siglip",
        "text_config": text,
        "vision_config": vision,
        "mm_hidden_size": 32,
        # the processor takes Siglip2's NaFlex image processor for a tower named so
        "mm_vision_tower": "tiny-siglip2-naflex",
        "mm_vision_select_layer": -2,
        "min_num_patches": 4,
        "max_num_patches": MAX_PATCHES,
        "max_position_embeddings": 4096,
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": 2,
    }
