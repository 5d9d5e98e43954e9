"""What Gemma 4's images add to the family-generic tests (test_vision_engine.py runs those on the
tiny Gemma 4 too): each image's rows attend to each other both ways and take their per-layer
inputs from id 0 and enter after the text model's input scaling, as mlx-vlm's gemma4 does;
switching any of these off, or letting a window layer's image rows see past their window outside
their block, makes some request's greedy ids differ from mlx-vlm's, so the parity tests see all
four. An image block is never split by a prefill
chunk nor resumed midway from the prefix cache, and one longer than a step is refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.families import FAMILIES
from macbatch.engine.multimodal.images import Image
from macbatch.engine.multimodal.prompt_images import PromptImages
from tests.support.image_requests import cases, chat, expected
from tests.support.tiny_vlm_gemma4 import rendered, save_tiny_gemma4
from tests.support.vlm_families import TinyVlm

pytest.importorskip("mlx_vlm")

PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
CONFIG = EngineConfig(num_blocks=256, block_size=8, max_num_batched_tokens=12)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory) -> TinyVlm:
    return TinyVlm("gemma4", save_tiny_gemma4(tmp_path_factory.mktemp("g4") / "m"), rendered)


def _mismatches(vlm: TinyVlm, image_files: list[Path]) -> int:
    engine = Engine.load(str(vlm.path), CONFIG)
    todo = cases(image_files)
    outputs = engine.generate([chat(q, imgs) for q, imgs in todo], PARAMS)
    return sum(out.token_ids != expected(vlm, q, imgs, 8) for (q, imgs), out in zip(todo, outputs))


def test_causal_image_blocks_differ_from_mlx_vlm(
    gemma4: TinyVlm, image_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the kernel's causal rows left as they are
    monkeypatch.setattr("macbatch.engine.model.paged_cache.attend_blocks", lambda out, *rest: out)
    assert _mismatches(gemma4, image_files) > 0


def test_per_layer_inputs_of_the_image_token_differ_from_mlx_vlm(
    gemma4: TinyVlm, image_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine.load(str(gemma4.path), CONFIG)
    vision = engine.processor.vision.encoder
    assert vision is not None
    monkeypatch.setattr("macbatch.engine.model.adapter.IMAGE_ROW_TOKEN", vision.image_token)
    assert _mismatches(gemma4, image_files) > 0


def test_without_bidirectional_attention_image_rows_are_causal_as_in_mlx_vlm(
    tmp_path: Path, image_files: list[Path]
) -> None:
    causal = TinyVlm("gemma4", save_tiny_gemma4(tmp_path / "causal", bidirectional=False), rendered)
    engine = Engine.load(str(causal.path), CONFIG)
    request = engine.processor.process(chat("what?", [image_files[1]]), PARAMS)
    assert request.images is not None and request.images.blocks is None
    assert _mismatches(causal, image_files) == 0


def test_the_same_image_with_other_words_resumes_outside_the_image_block(
    gemma4: TinyVlm, image_files: list[Path]
) -> None:
    engine = Engine.load(str(gemma4.path), CONFIG)
    image = [image_files[1]]
    engine.generate([chat("first words here", image)], PARAMS)
    request = engine.processor.process(chat("other words", image), PARAMS)
    engine.enqueue(request)
    while engine.has_unfinished():
        engine.step()
    assert request.images is not None
    assert request.images.can_resume_at(request.metrics.cached_tokens)
    assert request.output_token_ids == expected(gemma4, "other words", image, 8)


def test_an_image_longer_than_a_step_is_refused(gemma4: TinyVlm, image_files: list[Path]) -> None:
    engine = Engine.load(str(gemma4.path), EngineConfig(num_blocks=64, max_num_batched_tokens=4))
    with pytest.raises(ValueError, match="rows attends to itself both ways.*max_num_batched"):
        engine.add_request(chat("what?", [image_files[1]]))
    [out] = engine.generate(["hello"], PARAMS)  # and it keeps serving
    assert len(out.token_ids) == 8


def test_chunks_and_resume_points_stay_outside_image_blocks() -> None:
    image = Image(b"", "00", 1, 1)
    placed = PromptImages((image, image), np.array([5, 6, 7, 8, 12, 13]))
    placed.blocks = np.array([[5, 9], [12, 14]])
    assert placed.chunk_tokens(0, 7) == 5  # would end inside [5, 9): stops before it
    assert placed.chunk_tokens(0, 9) == 9
    assert placed.chunk_tokens(5, 3) == 0  # the block needs 4 rows: wait for room
    assert placed.chunk_tokens(9, 4) == 3
    assert [p for p in range(16) if not placed.can_resume_at(p)] == [6, 7, 8, 13]
    assert placed.longest_block == 4


def test_image_rows_on_window_layers_keep_their_window_outside_the_block(
    gemma4: TinyVlm, image_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from macbatch.engine.model import image_blocks

    def windowless(out, queries, pages, tables, blocks, layer):  # type: ignore[no-untyped-def]
        return image_blocks.attend_blocks(
            out, queries, pages, tables, blocks, layer._replace(sliding_window=None)
        )

    monkeypatch.setattr("macbatch.engine.model.paged_cache.attend_blocks", windowless)
    assert _mismatches(gemma4, image_files) > 0


def test_image_rows_scaled_again_by_the_text_model_differ_from_mlx_vlm(
    gemma4: TinyVlm, image_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # mlx-vlm puts the image features in after the token rows' sqrt(hidden) scale
    family = FAMILIES["gemma4"]
    assert family.vision is not None
    unscaled = replace(family, vision=replace(family.vision, scaled_rows=False))
    monkeypatch.setitem(FAMILIES, "gemma4", unscaled)
    assert _mismatches(gemma4, image_files) > 0
