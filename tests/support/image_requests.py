"""The image requests the vision engine tests send (questions over one or several of the test
images in a user message) and mlx-vlm's greedy ids for each, the oracle they are compared to.
Several vision test modules send the same requests, so they live here rather than in one test
module that the others would import."""

from __future__ import annotations

from pathlib import Path

from macbatch.engine.inputs.prompt import PromptInput
from macbatch.engine.multimodal.images import load_image
from tests.support.vlm_families import TinyVlm
from tests.support.vlm_oracle import mlx_vlm_greedy

QUESTIONS = ["what is this?", "describe the picture in detail please", "colors?", "count them"]


def chat(question: str, images: list[Path]) -> PromptInput:
    parts = [{"type": "image", "image": load_image(p.read_bytes(), str(p))} for p in images]
    return PromptInput([{"role": "user", "content": [*parts, {"type": "text", "text": question}]}])


def expected(vlm: TinyVlm, question: str, images: list[Path], max_tokens: int) -> list[int]:
    """mlx-vlm's greedy ids for the text the tiny model's template renders."""
    return mlx_vlm_greedy(vlm.path, vlm.rendered(question, len(images)), images, max_tokens)


def cases(image_files: list[Path]) -> list[tuple[str, list[Path]]]:
    one, two, three, four = image_files
    return [
        (QUESTIONS[0], [one]),
        (QUESTIONS[1], [two]),
        (QUESTIONS[2], [three, four]),  # two images in one message
        (QUESTIONS[3], [four]),
    ]
