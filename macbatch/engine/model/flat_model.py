"""A text model with no inner transformer to pack (mlx-vlm's Idefics 3, Jina VLM ...: the
embeddings, layers, final norm and LM head in one module), seen as one: its own ``__call__`` with
the head left out gives the normed hidden states the adapter packs, and the adapter applies the
head apart (the load-time self-check holds both to the model's own forward)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def is_flat(model: nn.Module) -> bool:
    """Whether ``model`` holds its decoder layers and its LM head itself."""
    return isinstance(getattr(model, "layers", None), list) and isinstance(
        getattr(model, "lm_head", None), nn.Module
    )


class FlatTransformer:
    """``model`` without its LM head: calling it runs the model's own ``call`` and returns what
    the head would have been given."""

    def __init__(self, model: nn.Module, call: Callable[..., Any]) -> None:
        self._model = model
        self._call = call
        self.lm_head = _unchanged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, inputs: mx.array, **kwargs: Any) -> mx.array:
        out = self._call(self, inputs, **kwargs)
        return getattr(out, "logits", out)  # mlx-vlm's output record


def _unchanged(hidden: mx.array) -> mx.array:
    return hidden
