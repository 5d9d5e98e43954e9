"""The real Qwen3 and Mistral v0.3 tokenizers vendored in tests/support/tokenizers (see each
SOURCE.txt for origin and licence), loaded as mlx-lm loads a model's tokenizer, with a tiny
random model whose vocabulary fits them."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import mlx.nn as nn

from tests.support.tiny import build_model

TOKENIZERS = Path(__file__).parent / "tokenizers"
# the architecture and vocabulary of the model each tokenizer ships with
_MODELS = {"qwen3": ("qwen3", 151936), "mistral": ("llama", 32768)}


def generation_eos_ids(name: str) -> list[int]:
    """``eos_token_id`` of the tokenizer's generation_config.json, always as a list."""
    eos = json.loads((TOKENIZERS / name / "generation_config.json").read_text())["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


@cache
def load_real_tokenizer(name: str) -> Any:
    """mlx-lm's TokenizerWrapper with the EOS ids of generation_config.json, as ``load`` does."""
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(TOKENIZERS / name, eos_token_ids=generation_eos_ids(name))


def model_for(name: str) -> nn.Module:
    arch, vocab_size = _MODELS[name]
    return build_model(arch, vocab_size=vocab_size)


# Qwen3's generation prompt, as its thinking releases (Qwen3-*-Thinking-2507) write it: the
# reply starts inside the reasoning block.
QWEN3_OPENS = "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- else %}\n        {{- '<think>\\n' }}"


def open_reasoning(directory: Path) -> Path:
    """Patch the Qwen3 template in ``directory``'s tokenizer_config.json to open ``<think>``
    unless ``enable_thinking`` is false (a copy: the vendored files stay as they are)."""
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    closed = "{{- '<think>\\n\\n</think>\\n\\n' }}"
    assert config["chat_template"].count(closed) == 1
    config["chat_template"] = config["chat_template"].replace(closed, QWEN3_OPENS)
    config_path.write_text(json.dumps(config))
    return directory
