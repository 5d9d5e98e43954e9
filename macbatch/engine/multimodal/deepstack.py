"""Qwen3-VL's DeepStack in the packed step: features from the vision tower's intermediate layers
are added to the image rows' hidden states after each of the first text layers.

mlx-vlm's Qwen3-VL tower returns an image's merged-patch embeddings and one DeepStack feature per
``deepstack_visual_indexes`` entry, each the text model's width; its language model adds feature
``i`` to the image positions after decoder layer ``i``. Here an image's encoding is those side by
side, ``[rows, (1 + k) * H]``: the step's input embedding takes the first ``H`` columns (as for
every family) and the first ``k`` decoder layers, their class swapped, add their columns to the
step's image rows. A layer finds the step's image rows and embeddings on its paged cache (the
``PackedBatch``), so nothing else is threaded through the model; a step without image rows (every
decode) runs the layer unchanged.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


class _DeepStackLayer:
    """Mixed into a decoder layer's class: after the layer, the step's image rows get their
    DeepStack feature for this layer (``_deepstack_index``)."""

    _deepstack_index: int

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        h = super().__call__(x, *args, **kwargs)  # type: ignore[misc]
        cache = args[1] if len(args) > 1 else kwargs.get("cache")
        batch = getattr(cache, "batch", None)
        if batch is None or batch.image_rows is None or batch.image_embeddings is None:
            return h
        width = h.shape[-1]
        first = (1 + self._deepstack_index) * width
        feature = batch.image_embeddings[:, first : first + width].astype(h.dtype)
        return h.at[batch.image_rows].add(feature[:, None])


def install_deepstack(layers: list[nn.Module], count: int) -> None:
    """Swap the class of the first ``count`` decoder ``layers`` for one that adds the DeepStack
    features of its index (the layers keep their weights and everything else)."""
    if count > len(layers):
        raise ValueError(f"{count} DeepStack features but only {len(layers)} text layers")
    for index, layer in enumerate(layers[:count]):
        base = type(layer)
        layer.__class__ = type(f"DeepStack{base.__name__}", (_DeepStackLayer, base), {})
        object.__setattr__(layer, "_deepstack_index", index)
