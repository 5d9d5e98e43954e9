"""The pooling oracle: one direct forward of the same mlx-lm model on one unpadded input (no
cache, no paging, no packing), pooled as the engine's methods are defined."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def direct_hidden(model: nn.Module, ids: list[int]) -> np.ndarray:
    """The last layer's normed hidden states ``[L, H]`` (float64) of the inner transformer (a
    multimodal or hybrid checkpoint's text model's)."""
    inner = getattr(model, "language_model", model).model
    return np.array(inner(mx.array([ids]))[0].astype(mx.float32), dtype=np.float64)


def direct_pooled(
    model: nn.Module,
    ids: list[int],
    method: str,
    normalize: bool = True,
    dimensions: int | None = None,
) -> np.ndarray:
    hidden = direct_hidden(model, ids)
    vector = {"last": hidden[-1], "cls": hidden[0], "mean": hidden.mean(axis=0)}[method]
    if dimensions is not None:
        vector = vector[:dimensions]
    return vector / np.linalg.norm(vector) if normalize else vector


def direct_yes_probability(model: nn.Module, ids: list[int], yes: int, no: int) -> float:
    """P(yes) of the softmax over the yes and no logits at the last position of the model's
    own full forward (logits included)."""
    logits = np.array(model(mx.array([ids]))[0, -1].astype(mx.float32), dtype=np.float64)
    pair = logits[[yes, no]]
    pair = np.exp(pair - pair.max())
    return float(pair[0] / pair.sum())


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
