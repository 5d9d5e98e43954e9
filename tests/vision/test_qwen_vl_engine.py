"""M-RoPE images in the packed step (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, their MoE checkpoints,
Qwen3-Omni, GLM-4V, GLM-4V MoE, GLM-OCR): image rows at three-part positions and every later row
shifted by the request's rope delta. Greedy ids equal mlx-vlm's own generation on a tiny
random-weight model of each (tests/support/tiny_qwen_vl.py; Qwen3.5's text model is a hybrid whose
Gated DeltaNet layers carry state slots; GLM's and Qwen3-Omni's are mlx-vlm's own, handed the
positions as their position ids) with several prompts, images and a text-only prompt in flight,
12-token prefill chunks through the image rows, preemption, and a second pass that hits the encode
and prefix caches (its positions derived from the prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.image_requests import chat
from tests.support.tiny_qwen_vl import rendered
from tests.support.vlm_oracle import mlx_vlm_greedy

# the vision extra (mlx-vlm, Pillow); skipped without it: pip install -e '.[vision]'
pytest.importorskip("mlx_vlm")

PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def cases(image_files: list[Path]) -> list[tuple[str, list[Path]]]:
    one, two, three, four = image_files
    return [
        ("what is this?", [two]),
        ("describe the two pictures in detail please", [one, four]),  # two grids in one prompt
        ("colors?", [three]),
        ("no picture here, just words", []),  # a text-only row in the same steps
        ("count them", [four]),
    ]


def expect(path: Path, todo: list[tuple[str, list[Path]]], outputs: list, tokens: int) -> None:
    family = json.loads((path / "config.json").read_text())["model_type"]
    for (question, images), out in zip(todo, outputs):
        wanted = mlx_vlm_greedy(path, rendered(family, question, len(images)), images, tokens)
        assert out.token_ids == wanted, (question, [p.name for p in images])


@pytest.fixture(scope="module")
def engine(qwen_vl_path: Path) -> Engine:
    # 8-token blocks and 12-token prefill chunks: image grids span chunk boundaries
    config = EngineConfig(num_blocks=256, block_size=8, max_num_batched_tokens=12)
    return Engine.load(str(qwen_vl_path), config)


def test_greedy_ids_equal_mlx_vlm_with_several_in_flight(
    engine: Engine, qwen_vl_path: Path, image_files: list[Path]
) -> None:
    todo = cases(image_files)
    outputs = engine.generate([chat(q, imgs) for q, imgs in todo], PARAMS)
    expect(qwen_vl_path, todo, outputs, 8)


def test_image_rows_sit_on_their_grid_and_later_rows_shift(
    engine: Engine, image_files: list[Path]
) -> None:
    # 64x48 pixels at 14-pixel patches, 2x2 merged: a 1 x 2 x 2 grid of rows
    request = engine.processor.process(chat("what?", [image_files[1]]), PARAMS)
    placed = request.images
    assert placed is not None and placed.rope is not None
    first = int(placed.positions[0])
    rows = placed.rope[first : first + placed.positions.size]
    assert (rows - first).tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]]
    assert placed.rope_delta == 2 - placed.positions.size  # the grid's extent 2, not 4 rows
    after = placed.rope[first + placed.positions.size :]
    np.testing.assert_array_equal(after[:, 0], first + 2 + np.arange(len(after)))


def test_second_pass_hits_the_encode_and_prefix_caches(
    engine: Engine, qwen_vl_path: Path, image_files: list[Path]
) -> None:
    vision = engine.processor.vision.encoder
    assert vision is not None
    question = "describe the two pictures in detail please"
    images = [image_files[0], image_files[3]]
    [first] = engine.generate([chat(question, images)], PARAMS)
    encoded = vision.cache.encoded
    request = engine.processor.process(chat(question, images), PARAMS)
    engine.enqueue(request)
    while engine.has_unfinished():
        engine.step()
    assert vision.cache.encoded == encoded  # the images were not run through the tower again
    assert request.metrics.cached_tokens >= 16  # whole blocks through the image rows
    assert request.output_token_ids == first.token_ids
    expect(qwen_vl_path, [(question, images)], [first], 8)


def test_preempted_image_requests_still_equal_mlx_vlm(
    qwen_vl_path: Path, image_files: list[Path]
) -> None:
    # 9 blocks of 8 tokens for five requests of ~20-40 tokens: some are preempted and recomputed
    # (image rows and rows past the prompt, at their shifted positions) from their prompt
    config = EngineConfig(num_blocks=9, block_size=8, max_num_batched_tokens=16)
    engine = Engine.load(str(qwen_vl_path), config)
    todo = cases(image_files)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outputs = engine.generate([chat(q, imgs) for q, imgs in todo], params)
    assert sum(out.metrics.preemptions for out in outputs) > 0
    expect(qwen_vl_path, todo, outputs, 16)


def test_decode_rows_after_an_image_run_compiled(
    qwen_vl_path: Path, image_files: list[Path]
) -> None:
    """Every decode row after an image sits at one shifted 1-D position, so a decode step of
    image requests takes the compiled path (an attention-only text model's, unless its forward
    evaluates between its layers: Qwen3-Omni's), ids unchanged."""
    config = EngineConfig(num_blocks=256, block_size=8, compile_decode_after=0)
    engine = Engine.load(str(qwen_vl_path), config)
    todo = cases(image_files)[:3]
    outputs = engine.generate([chat(q, imgs) for q, imgs in todo], PARAMS)
    expect(qwen_vl_path, todo, outputs, 8)
    compiled = engine.runner.compiled
    untraced = engine.runner.adapter.family.evaluates_between_layers
    assert (compiled is None) == (engine.runner.states is not None or untraced)  # Qwen3.5: hybrid
    assert compiled is None or compiled.compiled_shapes > 0
