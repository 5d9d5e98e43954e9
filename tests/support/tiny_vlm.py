"""A tiny random-weight Mistral 3 (Pixtral vision) VLM built from mlx-vlm's own classes and saved
in the Hugging Face layout with its processor configs, so mlx-vlm's loader and image processor
and mlx-lm's loader all read it offline. Its tokenizer is the vendored real Mistral v0.3 one
with Mistral 3's [IMG_BREAK] / [IMG_END] tokens added ([IMG] it already has). Also the helpers
the other tiny VLMs (tests/support/tiny_vlm_gemma3.py) are built with."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from macbatch.demo.vision import save_random_vlm
from tests.support.real_tokenizers import TOKENIZERS

VOCAB_SIZE = 32832  # the v0.3 vocabulary (32768) and the two added image tokens, rounded up
# A chat template in the shape of Mistral 3's own (an image part renders as [IMG]), written for
# the tiny model: the vendored v0.3 template has no image parts.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}[IMG]"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def rendered(question: str, images: int) -> str:
    """What CHAT_TEMPLATE renders for one user message of ``images`` images, then ``question``."""
    return "<s>[INST]" + "[IMG]" * images + question + "[/INST]"


def save_tiny_vlm(path: Path, seed: int = 0) -> Path:
    """The model directory (weights in float32, ``language_model.*`` / ``vision_tower.*`` /
    ``multi_modal_projector.*`` as mlx-vlm saves them), built with the same mlx-vlm classes and
    configs as the packaged ``demo-vision`` model but with the real Mistral v0.3 tokenizer."""
    tokenizer = saved_tokenizer(path, ["[IMG_BREAK]", "[IMG_END]"], CHAT_TEMPLATE)
    image_token = tokenizer.convert_tokens_to_ids("[IMG]")
    save_random_vlm(path, image_token, VOCAB_SIZE, eos_token_id=2, seed=seed)
    return path


def saved_tokenizer(
    path: Path, added: list[str], template: str, named: dict[str, str] | None = None
) -> Any:
    """The vendored Mistral v0.3 tokenizer with ``added`` special tokens and ``template``, saved
    in ``path`` (made if missing); ``named``: special tokens by the attribute names a real
    tokenizer config gives them (``image_token`` ...), which mlx-vlm's processors read."""
    from transformers import AutoTokenizer

    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        shutil.copy(TOKENIZERS / "mistral" / name, path / name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": added})
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    if named:
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
        tokenizer_config["extra_special_tokens"] = named
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return tokenizer


def png_bytes(width: int, height: int, seed: int) -> bytes:
    """A random-pixel PNG (each seed a different image)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()
