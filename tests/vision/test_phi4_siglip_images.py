"""Phi-4-SigLIP's (``phi4_siglip``, checkpoints' ``phi4-siglip``) images stay refused, for
measured reasons: its processor writes one id (-200, no token) per image, which mlx-vlm's model
(the oracle) replaces by all the image's real patches (the sum of its ``pixel_attention_mask``),
so its input has more rows than the prompt has ids; and mlx-vlm's processor for it cannot read an
image here: for a NaFlex tower it takes transformers' ``Siglip2ImageProcessor``, which imports
PyTorch, and on that ``ImportError`` it falls back to ``AutoProcessor``, which its own patch
sends back to itself (it recursed until killed, 10 minutes, on the tiny model); for any other
tower it takes ``SiglipImageProcessor``, whose ``[B, 3, H, W]`` pixels the Siglip2 tower's
patch ``Linear`` does not take. Text is served."""

from __future__ import annotations

import io
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from macbatch.demo.vision import random_vlm
from macbatch.engine.model.families import family
from macbatch.engine.multimodal.vision import unavailable_reason
from tests.support.tiny_vlm import png_bytes, saved_tokenizer
from tests.support.tiny_vlm_onevision import CHAT_TEMPLATE
from tests.support.tiny_vlm_phi4siglip import MAX_PATCHES, config, rendered

pytest.importorskip("mlx_vlm")


def _processor(path: Path) -> object:
    """mlx-vlm's Phi-4-SigLIP processor over transformers' PyTorch-free Siglip2 image
    processor (what its own ``from_pretrained`` would build, given PyTorch)."""
    from mlx_vlm.models.phi4_siglip.processing_phi4_siglip import Phi4SigLipProcessor
    from transformers.models.siglip2.image_processing_pil_siglip2 import (
        Siglip2ImageProcessorPil,
    )

    tokenizer = saved_tokenizer(path, ["<|im_start|>", "<|im_end|>"], CHAT_TEMPLATE)
    half = [0.5, 0.5, 0.5]
    images = Siglip2ImageProcessorPil(
        patch_size=4, max_num_patches=MAX_PATCHES, image_mean=half, image_std=half
    )
    return Phi4SigLipProcessor(images, tokenizer)


def test_one_id_per_image_takes_the_image_s_real_patches(tmp_path: Path) -> None:
    from mlx_vlm.models import phi4_siglip
    from PIL import Image

    model = random_vlm(phi4_siglip, config(), 0)
    processor = _processor(tmp_path)
    shapes = [(24, 16), (16, 16)]
    pictures = [Image.open(io.BytesIO(png_bytes(w, h, seed))) for seed, (w, h) in enumerate(shapes)]
    inputs = processor(text=rendered("What is it?", 2), images=pictures)  # type: ignore[operator]
    ids = np.array(inputs["input_ids"])
    assert (ids == phi4_siglip.phi4_siglip.IMAGE_TOKEN_INDEX).sum() == 2
    patches = np.array(inputs["pixel_attention_mask"]).sum(axis=1)
    assert len(set(patches.tolist())) == 2  # the rows depend on the image's shape
    embedded = model.get_input_embeddings(
        mx.array(ids),
        pixel_values=mx.array(inputs["pixel_values"]),
        spatial_shapes=mx.array(inputs["spatial_shapes"]),
        pixel_attention_mask=mx.array(inputs["pixel_attention_mask"]),
    ).inputs_embeds
    assert embedded.shape[1] == ids.shape[1] - 2 + int(patches.sum())


def test_its_naflex_image_processor_needs_pytorch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("PyTorch is installed here: mlx-vlm's processor may read images")
    with pytest.raises(ImportError):
        from transformers.models.siglip2.image_processing_siglip2 import (  # noqa: F401
            Siglip2ImageProcessor,
        )


def test_images_are_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config()))  # model_type "phi4-siglip"
    reason = unavailable_reason(tmp_path, "tiny-phi4-siglip") or ""
    assert "one id per image" in reason and "PyTorch" in reason
    assert family("phi4_siglip").vision is None
