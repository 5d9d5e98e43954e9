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
        _one_bos(processor, text) if images else text,
        image=[str(p) for p in images] or None,
        max_tokens=max_tokens,
        temperature=0.0,
        verbose=False,
    )


def mlx_vlm_text_greedy(model: Any, prompt: list[int], max_tokens: int) -> list[tuple[int, float]]:
    """mlx-vlm's own ``generate_step`` (its language model, its own cache) at temperature 0 on
    token ids alone: each greedy token with its log-probability."""
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step

    steps = []
    ids = mx.array([prompt])
    for token, logprobs in generate_step(
        ids, model, None, None, max_tokens=max_tokens, temperature=0.0
    ):
        steps.append((int(token), float(logprobs.reshape(-1)[int(token)])))
    return steps


def _one_bos(processor: Any, text: str) -> str:
    """``text`` without the BOS its template wrote. mlx-vlm deviates from the reference here:
    it has most processors tokenize the rendered template (which begins with BOS) with the
    tokenizer's special tokens again, two BOS tokens where transformers' processor
    (``apply_chat_template``, tests/vision/test_one_bos.py) and the text path have one. Given
    the text after it, the processor's own BOS is the one."""
    bos = getattr(processor.tokenizer, "bos_token", None)
    return text[len(bos) :] if bos and text.startswith(bos) else text
