"""Idefics 2's images stay refused, for a measured reason: mlx-vlm's Idefics 2 (the oracle) pads a
prompt's images to the largest one's size and its vision tower attends over that padding, so an
image's rows depend on the other images of its prompt; the engine encodes each image alone (its
encode cache is keyed by the image). A single image's rows are its own. Text is served."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.image_requests import chat
from tests.support.tiny_vlm_idefics2 import rendered, save_tiny_idefics2

pytest.importorskip("mlx_vlm")


@pytest.fixture(scope="module")
def idefics2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_idefics2(tmp_path_factory.mktemp("models") / "tiny-idefics2")


def _image_rows(path: Path, images: list[Path]) -> np.ndarray:
    """mlx-vlm's own input embeddings of a prompt of ``images``: its image rows, in order."""
    from mlx_vlm import load
    from mlx_vlm.utils import prepare_inputs
    from PIL import Image

    model, processor = load(str(path))
    token = model.config.image_token_index
    text = rendered("what?", len(images)).removeprefix("<s>")
    pil = [Image.open(p) for p in images]
    inputs = dict(prepare_inputs(processor, images=pil, prompts=text, image_token_index=token))
    ids = inputs.pop("input_ids")
    inputs.pop("attention_mask", None)
    embedded = model.get_input_embeddings(ids, **inputs).inputs_embeds[0]
    rows = np.flatnonzero(np.array(ids).reshape(-1) == token)
    return np.array(embedded[mx.array(rows)])


def test_an_images_rows_depend_on_the_other_images_of_its_prompt(
    idefics2_path: Path, image_files: list[Path]
) -> None:
    small, large = image_files[2], image_files[1]  # 16x16 beside 64x48: padded to the larger
    alone = _image_rows(idefics2_path, [small])
    beside = _image_rows(idefics2_path, [small, large])
    assert np.abs(beside[: len(alone)] - alone).max() > 1e-3
    # the same image twice pads nothing: its rows are its own
    twice = _image_rows(idefics2_path, [small, small])
    np.testing.assert_allclose(twice[: len(alone)], alone, atol=1e-5)


def test_images_are_refused_with_the_reason_and_text_is_served(
    idefics2_path: Path, image_files: list[Path]
) -> None:
    engine = Engine.load(str(idefics2_path), EngineConfig(num_blocks=32))
    with pytest.raises(ValueError, match="attends over the padding"):
        engine.add_request(chat("what?", [image_files[0]]))
    [out] = engine.generate(["hello"], SamplingParams(max_tokens=4, temperature=0))
    assert len(out.token_ids) == 4
