"""The tiny VLMs (tests/support/tiny_vlm*.py: Mistral 3, Gemma 3, Gemma 4, Idefics 3, SmolVLM,
LLaVA-OneVision, Aya Vision, InternVL 2.5 and 3) saved once per session, their images on disk, and
mlx-vlm's own greedy generation as the oracle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.load_memo import loads_memoized
from tests.support.tiny_qwen_vl import save_tiny_qwen_vl
from tests.support.tiny_vlm import png_bytes, save_tiny_vlm
from tests.support.vlm_families import TINY_VLMS, TinyVlm

# (width, height, seed): sizes that give 1x1 to 4x3 image grids (16-pixel merged patches)
IMAGE_SPECS = [(40, 24, 1), (64, 48, 2), (16, 16, 3), (33, 60, 4)]


@pytest.fixture(scope="package", autouse=True)
def tokenizers_read_once() -> Iterator[None]:
    """Each tiny VLM's tokenizer and processor read once, each engine and oracle given its own
    copy (tests/support/load_memo.py): ~3 s saved per load of the same model after the second."""
    with loads_memoized():
        yield


@pytest.fixture(scope="session")
def vlm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-mistral3")


@pytest.fixture(scope="session", params=sorted(TINY_VLMS))
def family_vlm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TinyVlm:
    """Each family's tiny model in turn (the family-generic tests run once per family)."""
    family = request.param
    save, rendered = TINY_VLMS[family]
    path = save(tmp_path_factory.mktemp("models") / f"tiny-{family}")
    return TinyVlm(family, path, rendered)


@pytest.fixture(
    scope="session",
    params=[
        *("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe"),
        *("qwen3_omni_moe", "glm4v", "glm4v_moe", "glm_ocr"),
    ],
)
def qwen_vl_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-VL and a tiny Qwen2.5-VL (sectioned M-RoPE), a tiny Qwen3-VL (interleaved
    M-RoPE, DeepStack), a tiny Qwen3.5 (hybrid text model, interleaved partial M-RoPE), their MoE
    checkpoints (the same towers, routed experts in the text model), a tiny Qwen3-Omni thinker
    (Qwen3-VL's image path on mlx-vlm's MoE text model), a tiny
    GLM-4V, GLM-4V MoE and GLM-OCR (mlx-vlm's text models, rotating by the M-RoPE position ids
    they are handed)."""
    family = request.param
    return save_tiny_qwen_vl(tmp_path_factory.mktemp("models") / f"tiny-{family}", family=family)


@pytest.fixture(scope="session")
def image_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("images")
    paths = []
    for width, height, seed in IMAGE_SPECS:
        path = folder / f"image{seed}.png"
        path.write_bytes(png_bytes(width, height, seed))
        paths.append(path)
    return paths
