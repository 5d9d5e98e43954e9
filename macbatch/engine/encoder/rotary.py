"""Rotary positions for the packed rows of the rotary encoder families (gte, Nomic BERT,
ModernBERT): each row turned by its own position within its sequence, the two halves of each
head rotated together (GPT-NeoX's ``rotate_half``, as all three publish theirs)."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np


def inverse_frequencies(dim: int, theta: float, ntk_factor: float = 1.0) -> np.ndarray:
    """[dim / 2] float64: ``theta^(-2i/dim)``; with gte's fixed NTK scaling the base grows by
    ``ntk_factor`` and every frequency shrinks by ``ntk_factor^(2/dim)`` (1: plain RoPE)."""
    inverse = 1.0 / (theta * ntk_factor) ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return inverse / ntk_factor ** (2 / dim)


@dataclass(frozen=True)
class Rotation:
    """The cos and sin of each packed row's angles, [T, 1, dim], computed once a pass and shared
    by every layer under the same base."""

    cos: mx.array
    sin: mx.array

    @classmethod
    def build(cls, positions: mx.array, inverse: np.ndarray) -> Rotation:
        angles = positions.astype(mx.float32)[:, None] * mx.array(inverse.astype(np.float32))
        angles = mx.concatenate([angles, angles], axis=-1)[:, None, :]
        return cls(mx.cos(angles), mx.sin(angles))

    def __call__(self, x: mx.array) -> mx.array:
        """``x`` [T, H, dim] rotated."""
        half = x.shape[-1] // 2
        turned = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return (x * self.cos + turned * self.sin).astype(x.dtype)
