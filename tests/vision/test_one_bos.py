"""An image prompt gets one BOS, as transformers' processor tokenizes a chat with images and as
the text path does (issue 46: Gemma 3 image prompts had two, the template's and the tokenizer's).

The reference is the processor's own ``apply_chat_template(tokenize=True)`` (transformers'
``ProcessorMixin``, which tokenizes the rendered template without special tokens). mlx-vlm
deviates from it: its ``generate`` has the processor add the tokenizer's special tokens to the
rendered template, so its ids start with two BOS (tests/support/vlm_oracle.py gives it the text
after the template's BOS instead)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig
from macbatch.engine.inputs.prompt import PromptInput
from macbatch.engine.multimodal.images import load_image
from tests.support.tiny_vlm_gemma3 import save_tiny_gemma3
from tests.support.vlm_families import TinyVlm

pytest.importorskip("mlx_vlm")


def _messages(images: list[Path], question: str, image_part) -> list[dict]:
    parts = [image_part(path) for path in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


def _reference_ids(path: Path, images: list[Path], question: str) -> list[int]:
    """transformers' own Gemma 3 processor (not mlx-vlm's, which AutoProcessor would pick)."""
    from transformers.models.gemma3 import Gemma3Processor

    processor = Gemma3Processor.from_pretrained(str(path))
    messages = _messages(images, question, lambda p: {"type": "image", "url": str(p)})
    inputs = processor.apply_chat_template(
        messages, chat_template=processor.tokenizer.chat_template, add_generation_prompt=True,
        tokenize=True, return_dict=True,
    )  # fmt: skip
    return [int(t) for t in np.array(inputs["input_ids"]).reshape(-1)]


def _engine_ids(engine: Engine, images: list[Path], question: str) -> list[int]:
    image = lambda p: {"type": "image", "image": load_image(p.read_bytes(), str(p))}  # noqa: E731
    prompt = PromptInput(_messages(images, question, image))
    return engine.processor.encode_with_images(prompt)[0]


def test_gemma3_image_prompt_ids_equal_transformers_processor(
    tmp_path_factory: pytest.TempPathFactory, image_files: list[Path]
) -> None:
    path = save_tiny_gemma3(tmp_path_factory.mktemp("models") / "tiny-gemma3")
    engine = Engine.load(str(path), EngineConfig(num_blocks=64))
    images, question = image_files[:2], "what is this?"
    ids = _engine_ids(engine, images, question)
    assert ids == _reference_ids(path, images, question)
    assert ids.count(engine.tokenizer.bos_token_id) == 1


def test_every_family_has_the_text_paths_one_bos(
    family_vlm: TinyVlm, image_files: list[Path]
) -> None:
    engine = Engine.load(str(family_vlm.path), EngineConfig(num_blocks=64))
    ids = _engine_ids(engine, image_files[:1], "what is this?")
    text_ids = engine.processor.encode(PromptInput([{"role": "user", "content": "hi"}]))
    bos = engine.tokenizer.bos_token_id
    assert text_ids[0] == bos and text_ids[1] != bos  # the text path: one BOS
    assert ids[0] == bos and ids[1] != bos
