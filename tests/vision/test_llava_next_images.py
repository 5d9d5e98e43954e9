"""LLaVA-NeXT's and Granite Vision's images stay refused, for a measured reason: mlx-vlm's
LLaVA-NeXT and Granite Vision (a LLaVA-NeXT: the oracle) do not put one row at each image token
as their processors count them (AnyRes features unpadded, a newline per row): they put a whole
crop's rows, then blocks of the newline row, in place of each image token, so their input has
more rows than the prompt has ids, and they read only the first image of a prompt. The engine
gives each image token one row. Text is served."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from macbatch.engine.model.families import family
from macbatch.engine.multimodal.vision import unavailable_reason
from tests.support.tiny_vlm_text import vlm_text_model

pytest.importorskip("mlx_vlm")


FAMILIES = ["llava_next", "granite_vision"]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_image_token_takes_a_whole_crop_of_rows(name: str) -> None:
    model, config = vlm_text_model(name)
    token = config["image_token_index"]
    crops, side = 3, config["vision_config"]["image_size"]
    per_crop = (side // config["vision_config"]["patch_size"]) ** 2  # CLS dropped ("default")
    pixels = mx.random.normal((1, crops, 3, side, side))
    text = [1, 7, 9, 10]
    for placeholders in (1, 4):
        ids = mx.array([text[:2] + [token] * placeholders + text[2:]])
        rows = model.get_input_embeddings(ids, pixel_values=pixels).inputs_embeds.shape[1]
        assert rows == len(text) + placeholders * per_crop != ids.shape[1]


@pytest.mark.parametrize("name", FAMILIES)
def test_images_are_refused_with_the_reason(tmp_path: Path, name: str) -> None:
    _, config = vlm_text_model(name)
    (tmp_path / "config.json").write_text(json.dumps(config))
    reason = unavailable_reason(tmp_path, f"tiny-{name}") or ""
    assert "outnumbering the prompt's ids" in reason
    assert family(name).vision is None
