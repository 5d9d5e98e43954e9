"""A deliberately odd architecture, to hold every front end to refusing what the engine cannot
read: Llama, except that each attention layer first asks its cache ``is_trimmable()``, which
mlx-lm's caches answer and the engine's paged cache does not have. It is registered as an mlx-lm
model module, so its checkpoints load through mlx-lm like any other and mlx-lm runs them."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from mlx_lm.models import llama

from tests.support.tiny import save_model

ODD_TYPE = "macbatch_odd_cache"


class _OddAttention(llama.Attention):
    def __call__(self, x: Any, mask: Any = None, cache: Any = None) -> Any:
        if cache is not None:
            cache.is_trimmable()
        return super().__call__(x, mask, cache)


class _OddModel(llama.Model):
    def __init__(self, args: llama.ModelArgs) -> None:
        super().__init__(args)
        for layer in self.layers:
            layer.self_attn.__class__ = _OddAttention


def register() -> None:
    """Make ``mlx_lm.models.macbatch_odd_cache`` importable (mlx-lm picks a checkpoint's module
    by its ``model_type``)."""
    name = f"mlx_lm.models.{ODD_TYPE}"
    if name not in sys.modules:
        module = ModuleType(name)
        module.Model = _OddModel  # type: ignore[attr-defined]
        module.ModelArgs = llama.ModelArgs  # type: ignore[attr-defined]
        sys.modules[name] = module


def save_odd_model(path: Path) -> Path:
    """A tiny checkpoint of the odd architecture in Hugging Face layout."""
    register()
    return save_model(path, "llama", model_type=ODD_TYPE)
