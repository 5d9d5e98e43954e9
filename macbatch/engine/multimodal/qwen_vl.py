"""M-RoPE images (Qwen VL: ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``, Qwen3.5's ``qwen3_5`` and
Qwen3-Omni's ``qwen3_omni_moe``; GLM-4V's ``glm4v``): M-RoPE positions in the packed step.

Qwen VL's text model rotates each head's frequencies in three sections by three position parts
(temporal, height, width). A text row's three parts are equal, so mlx-lm's 1-D RoPE gives it;
an image row sits at its place in the image grid (the grid's origin one past the text before
it), and every row after an image is shifted by how much shorter the grid's extent is than its
row count (the request's rope delta). The positions come from the prompt's ids and image grids
alone, so a prefix-cache hit or a preempted request recomputes the same ones; a step with a row
of such a request gives the layers an ``[N, 3]`` offset, which ``MRoPE`` rotates by section.
Steps without one pass the 1-D positions to mlx-lm's own RoPE, unchanged.

The families differ in which frequency takes which part (their ``MRoPELayout`` in
model/families.py): Qwen2.5-VL gives consecutive sections to temporal, height and width; Qwen3-VL
and Qwen3.5 interleave them (height every third frequency from the second, width from the third,
each for its section's count). Qwen3.5 rotates only the first part of each head (partial rotary),
on its attention layers only (the Gated DeltaNet layers have none). Qwen3-VL also adds DeepStack
features to image rows after its first text layers (``deepstack.py``). GLM-4V's text model is
mlx-vlm's own, which takes M-RoPE position ids and rotates by them itself (its family's
``position_id_axes`` 3): the adapter hands it the same ``[N, 3]`` positions and its RoPE stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from macbatch.engine.model.families import MRoPELayout


def sectioned(sections: Sequence[int]) -> np.ndarray:
    """Which position part (0 temporal, 1 height, 2 width) each frequency takes, in
    consecutive sections (Qwen2.5-VL)."""
    return np.repeat(np.arange(3), sections)


def interleaved(sections: Sequence[int]) -> np.ndarray:
    """The same, interleaved (Qwen3.5 / Qwen3-VL): height on every third frequency from the
    second and width from the third, each for its section's count; temporal elsewhere."""
    parts = np.zeros(sum(sections), dtype=np.int64)
    for part in (1, 2):
        parts[np.arange(part, min(3 * sections[part], parts.size), 3)] = part
    return parts


class MRoPE(nn.Module):
    """A layer's RoPE: mlx-lm's for 1-D offsets, M-RoPE (non-traditional halves of the first
    ``2 * len(parts)`` dims of each head) for ``[N, 3]`` offsets of ``[N, heads, 1, D]`` rows;
    ``parts``: the position part of each frequency."""

    def __init__(self, rope: nn.Module, base: float, parts: np.ndarray) -> None:
        super().__init__()
        self._rope = rope
        self._dims = 2 * parts.size
        exponents = np.arange(0, self._dims, 2, dtype=np.float64) / self._dims
        self._inv_freq = mx.array(base**-exponents, dtype=mx.float32)
        self._section = mx.array(parts.astype(np.int32))

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        if not (isinstance(offset, mx.array) and offset.ndim == 2):
            return self._rope(x, offset=offset)
        angles = offset[:, self._section].astype(mx.float32) * self._inv_freq
        cos = mx.cos(angles)[:, None, None, :]
        sin = mx.sin(angles)[:, None, None, :]
        half = self._dims // 2
        x1, x2, rest = x[..., :half], x[..., half : self._dims], x[..., self._dims :]
        rotated = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
        if rest.shape[-1]:
            rotated.append(rest)
        return mx.concatenate(rotated, axis=-1).astype(x.dtype)


class MRoPEPositions:
    """The M-RoPE part of a ``VisionEncoder``: its text layers' RoPE replaced by ``MRoPE`` (unless
    ``rotates_itself``: a text model handed the positions as its M-RoPE position ids, mlx-vlm's
    GLM-4V, keeps its own), and each prompt's three-part positions."""

    def __init__(
        self, vlm: Any, text_model: nn.Module, layout: MRoPELayout, rotates_itself: bool = False
    ) -> None:
        self.merge = int(vlm.config.vision_config.spatial_merge_size)
        if rotates_itself:
            return
        text = vlm.config.text_config
        if layout.rope_parameters:  # with a partial rotary factor
            rope = text.rope_parameters
            sections, base = rope.get("mrope_section"), float(rope["rope_theta"])
            dims = int(text.head_dim * rope["partial_rotary_factor"])
        else:
            rope = text.rope_scaling or {}
            sections, base = rope.get("mrope_section"), text.rope_theta
            dims = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        split = interleaved if layout.interleaved else sectioned
        if not sections or 2 * sum(sections) != dims:
            raise ValueError(
                f"its rope settings {rope} have no mrope_section that splits the {dims} rotary "
                "dims of a head"
            )
        for layer in text_model.layers:
            attention = getattr(layer, "self_attn", None)  # a hybrid's recurrent layers: none
            if attention is not None:
                attention.rope = MRoPE(attention.rope, base, split(sections))

    def prompt_rope(
        self, ids: np.ndarray, rows: np.ndarray, grids: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """``[L, 3]`` positions of a prompt whose image rows are ``rows`` (images in order, each
        a ``(t, h, w)`` patch grid), and the delta of every position after the prompt."""
        out = np.empty((len(ids), 3), dtype=np.int64)
        cursor = next_position = taken = 0
        for t, h, w in np.asarray(grids, dtype=np.int64).reshape(-1, 3):
            h, w = h // self.merge, w // self.merge
            start = int(rows[taken])
            taken += t * h * w
            out[cursor:start] = next_position + np.arange(start - cursor)[:, None]
            origin = next_position + start - cursor
            grid = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij"))
            out[start : start + t * h * w] = origin + grid.reshape(3, -1).T
            next_position = origin + max(t, h, w)
            cursor = start + t * h * w
        if taken != len(rows):
            raise ValueError(f"the prompt has {len(rows)} image rows but its grids hold {taken}")
        out[cursor:] = next_position + np.arange(len(ids) - cursor)[:, None]
        return out, int(out.max()) + 1 - len(ids) if len(ids) else 0


def tower_features(tower: Any, inputs: dict[str, Any]) -> mx.array:
    """``[rows, H]``: one image's merged-patch embeddings from mlx-vlm's Qwen VL tower, from its
    processed pixels and patch grid, with the DeepStack features side by side after the rows
    when the tower returns some (Qwen3-VL's; Qwen3.5's returns none, deepstack.py)."""
    pixels = inputs["pixel_values"].astype(tower.patch_embed.proj.weight.dtype)
    out = tower(pixels, inputs["image_grid_thw"])
    if not isinstance(out, tuple):  # Qwen2.5-VL's: the merged rows alone
        return out
    merged, deepstack = out
    return mx.concatenate([merged, *deepstack], axis=-1) if deepstack else merged


def step_rope(chunks: Sequence[Any]) -> mx.array | None:
    """The RoPE positions of a step's rows (chunks in packing order) when a chunk's request has
    M-RoPE positions: ``[N, 3]`` when a row sits in an image grid; ``[N]`` when every row's
    three parts are equal (text, such as every decode row after an image: one 1-D position,
    shifted by the request's delta, which mlx-lm's own RoPE and the compiled decode step take);
    None when every row's 1-D position is its RoPE position."""
    if not any(c.request.images is not None and c.request.images.rope is not None for c in chunks):
        return None
    parts, flat = [], []
    for chunk in chunks:
        positions = np.arange(chunk.start, chunk.start + chunk.num_tokens)
        flat.append(positions)
        images = chunk.request.images
        rope = None if images is None else images.rope
        if rope is None:
            parts.append(np.repeat(positions[:, None], 3, axis=1))
            continue
        inside = positions[positions < len(rope)]
        after = positions[positions >= len(rope)] + images.rope_delta
        parts.append(np.concatenate([rope[inside], np.repeat(after[:, None], 3, axis=1)]))
    rope_rows = np.concatenate(parts)
    if (rope_rows != rope_rows[:, :1]).any():
        return mx.array(rope_rows.astype(np.int32))
    if (rope_rows[:, 0] == np.concatenate(flat)).all():
        return None
    return mx.array(rope_rows[:, 0].astype(np.int32))
