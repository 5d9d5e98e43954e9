"""Images in the packed step, for each family of ``TINY_VLMS`` (Mistral 3; Gemma 3 and Aya
Vision, whose window layers see image rows too; Gemma 4; Idefics 3, SmolVLM, LLaVA-OneVision,
InternVL 2.5 and 3, whose images are several tiles): greedy ids equal mlx-vlm's own generation with
several prompts and images in flight, an image request beside text ones, prefill chunks that
split an image's rows, and a second pass that hits the encode cache and the prefix cache
(different images never share blocks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.image_requests import QUESTIONS, cases, chat, expected
from tests.support.staggered import random_prompts
from tests.support.tiny import save_model
from tests.support.tiny_vlm import png_bytes
from tests.support.vlm_families import TinyVlm
from tests.support.vlm_oracle import mlx_vlm_text_ids

# the vision extra (mlx-vlm, Pillow); skipped without it: pip install -e '.[vision]'
pytest.importorskip("mlx_vlm")

PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(family_vlm: TinyVlm) -> Engine:
    # 8-token blocks and 12-token prefill chunks: every image's rows span a chunk boundary
    config = EngineConfig(num_blocks=256, block_size=8, max_num_batched_tokens=12)
    return Engine.load(str(family_vlm.path), config)


def test_greedy_ids_equal_mlx_vlm_with_several_in_flight(
    engine: Engine, family_vlm: TinyVlm, image_files: list[Path]
) -> None:
    todo = cases(image_files)
    outputs = engine.generate([chat(q, imgs) for q, imgs in todo], PARAMS)
    for (question, images), out in zip(todo, outputs):
        want = expected(family_vlm, question, images, 8)
        assert out.token_ids == want, (question, [p.name for p in images])


def test_an_image_request_beside_text_ones_equals_mlx_vlm(
    engine: Engine, family_vlm: TinyVlm, image_files: list[Path]
) -> None:
    # text rows and image rows packed in the same steps; the text requests' oracle is mlx-vlm's
    # own generation on their ids
    texts = random_prompts([9, 23], seed=5)
    question, images = QUESTIONS[2], [image_files[1]]
    outputs = engine.generate([texts[0], chat(question, images), texts[1]], PARAMS)
    assert outputs[1].token_ids == expected(family_vlm, question, images, 8)
    for prompt, out in zip(texts, [outputs[0], outputs[2]]):
        assert out.token_ids == mlx_vlm_text_ids(family_vlm.path, prompt, 8)


def test_second_pass_hits_the_encode_and_prefix_caches(
    engine: Engine, image_files: list[Path]
) -> None:
    vision = engine.processor.vision.encoder
    assert vision is not None
    question, images = QUESTIONS[1], [image_files[1]]
    [first] = engine.generate([chat(question, images)], PARAMS)
    encoded = vision.cache.encoded
    request = engine.processor.process(chat(question, images), PARAMS)
    engine.enqueue(request)
    while engine.has_unfinished():
        engine.step()
    assert vision.cache.encoded == encoded  # the image was not run through the tower again
    assert request.metrics.cached_tokens >= 16  # whole blocks through the image rows
    assert request.output_token_ids == first.token_ids


def test_a_different_image_never_shares_the_image_blocks(
    engine: Engine, family_vlm: TinyVlm, image_files: list[Path]
) -> None:
    question = "same words, different picture"
    engine.generate([chat(question, [image_files[1]])], PARAMS)
    other = [image_files[0].parent / "other.png"]
    other[0].write_bytes(png_bytes(64, 48, 99))  # the same size: the same token ids
    request = engine.processor.process(chat(question, other), PARAMS)
    engine.enqueue(request)
    while engine.has_unfinished():
        engine.step()
    first_image_row = int(request.images.positions[0]) if request.images else 0
    assert request.metrics.cached_tokens <= first_image_row
    assert request.output_token_ids == expected(family_vlm, question, other, 8)


def test_an_image_for_a_text_only_model_is_refused(tmp_path: Path, image_files: list[Path]) -> None:
    engine = Engine.load(str(save_model(tmp_path / "llama", "llama")), EngineConfig(num_blocks=16))
    with pytest.raises(ValueError, match="text-only model .* cannot read images"):
        engine.add_request(chat("what?", [image_files[0]]))
    [out] = engine.generate(["hello"], PARAMS)  # and it keeps serving
    assert len(out.token_ids) == 8


def test_preempted_image_requests_still_equal_mlx_vlm(
    family_vlm: TinyVlm, image_files: list[Path]
) -> None:
    # 10 blocks of 8 tokens for four requests of ~20-60 tokens each: some are preempted and
    # recomputed (their image rows included) from their prompt
    config = EngineConfig(num_blocks=10, block_size=8, max_num_batched_tokens=16)
    engine = Engine.load(str(family_vlm.path), config)
    todo = cases(image_files)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outputs = engine.generate([chat(q, imgs) for q, imgs in todo], params)
    assert sum(out.metrics.preemptions for out in outputs) > 0
    for (question, images), out in zip(todo, outputs):
        assert out.token_ids == expected(family_vlm, question, images, 16)


def test_without_mlx_vlm_an_image_says_what_to_install(
    vlm_path: Path, image_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlx_vlm", None)  # as if the vision extra were missing
    engine = Engine.load(str(vlm_path), EngineConfig(num_blocks=16))
    with pytest.raises(
        ValueError, match=r"images need mlx-vlm, .*pip install 'macbatch\[vision\]'"
    ):
        engine.add_request(chat("what?", [image_files[0]]))
    [out] = engine.generate(["hello"], PARAMS)  # text still runs
    assert len(out.token_ids) == 8


def test_ngram_speculation_keeps_image_requests_equal_to_mlx_vlm(
    family_vlm: TinyVlm, image_files: list[Path]
) -> None:
    # prompt-lookup drafts come from the prompt's tokens (image placeholders included); the
    # verification rows are decode rows, never image rows
    config = EngineConfig(num_blocks=256, block_size=8, speculative="ngram")
    engine = Engine.load(str(family_vlm.path), config)
    todo = cases(image_files)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outputs = engine.generate([chat(q, imgs) for q, imgs in todo], params)
    for (question, images), out in zip(todo, outputs):
        assert out.token_ids == expected(family_vlm, question, images, 16)


def test_under_mlx_launch_an_image_is_refused_with_the_reason(
    vlm_path: Path, image_files: list[Path]
) -> None:
    """Rank 0 of a launched group gets ``vision_for(..., launched=True)`` (Engine.load passes
    ``group is not None``); here on one process: the reason, not an encoder, and text runs."""
    from macbatch.engine.multimodal.vision import vision_for

    engine = Engine.load(str(vlm_path), EngineConfig(num_blocks=16))
    assert engine.processor.vision.encoder is not None  # alone, the same model takes images
    engine.processor.vision = vision_for(str(vlm_path), engine.runner.model, launched=True)
    with pytest.raises(ValueError, match="not supported under mlx.launch.* without mlx.launch"):
        engine.add_request(chat("what?", [image_files[0]]))
    [out] = engine.generate(["hello"], PARAMS)
    assert len(out.token_ids) == 8
