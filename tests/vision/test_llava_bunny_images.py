"""Bunny's (``llava_bunny``) images stay refused, for a measured reason: mlx-vlm's Bunny (the
oracle) puts its 729 image rows (a 27x27 SigLIP grid, which it asserts) in place of one image id
its processor never expands, so its input has more rows than the prompt has ids, and it reads
only a prompt's first image (a second image's id stays a token row, its pixels unread). The
engine gives each image token one row. Text is served."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from macbatch.engine.model.families import family
from macbatch.engine.multimodal.vision import unavailable_reason
from tests.support.tiny_vlm_text import vlm_text_model

pytest.importorskip("mlx_vlm")

GRID = dict(image_size=27, patch_size=1)  # 729 patches, the count mlx-vlm's Bunny asserts


def test_one_image_id_takes_729_rows_and_only_the_first_image_is_read() -> None:
    model, _ = vlm_text_model("llava_bunny", vision=GRID)
    token = model.config.image_token_index
    text = [1, 7, 9, 10]
    for images in (1, 2):
        ids = mx.array([text[:2] + [token] * images + text[2:]])
        pixels = mx.random.normal((images, 3, 27, 27))
        rows = model.get_input_embeddings(ids, pixel_values=pixels).inputs_embeds.shape[1]
        assert rows == ids.shape[1] - 1 + 729  # the first id's 729 rows, any second id a token


def test_images_are_refused_with_the_reason(tmp_path: Path) -> None:
    _, config = vlm_text_model("llava_bunny")
    (tmp_path / "config.json").write_text(json.dumps(config))
    reason = unavailable_reason(tmp_path, "tiny-bunny") or ""
    assert "729 image rows" in reason
    assert family("llava_bunny").vision is None
