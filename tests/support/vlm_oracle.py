"""mlx-vlm's own generation at temperature 0: the oracle the engine's image requests are compared
against (docs/vision.md)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any


@cache
def _mlx_vlm(path: str) -> tuple:
    from mlx_vlm import load

    return load(path)


def mlx_vlm_greedy(path: Path, text: str, images: list[Path], max_tokens: int) -> list[int]:
    """mlx-vlm's own ``generate`` at temperature 0: the ids it samples."""
    return list(_generate(path, text, images, max_tokens).token_ids)


def mlx_vlm_generate(path: Path, text: str, images: list[Path], max_tokens: int) -> str:
    """mlx-vlm's own ``generate`` at temperature 0: its text."""
    return str(_generate(path, text, images, max_tokens).text)


def _generate(path: Path, text: str, images: list[Path], max_tokens: int) -> Any:
    from mlx_vlm import generate

    model, processor = _mlx_vlm(str(path))
    return generate(
        model,
        processor,
        text,
        image=[str(p) for p in images] or None,
        max_tokens=max_tokens,
        temperature=0.0,
        verbose=False,
    )
