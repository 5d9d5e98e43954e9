"""Position ids counted with numpy from the cache's offset, as each row's own position.

GPT-BigCode (StarCoder) adds learned position embeddings at ``np.arange(cache[0].offset,
cache[0].offset + L)``: a number in mlx-lm's caches, but in the engine's packed step the offset is
the ``(N,)`` array of every row's position, one token per row. ``install`` replaces ``np`` in each
loaded mlx-lm model module by a stand-in that is numpy itself, except that ``arange`` from such an
array gives each row its position (``[N, 1]``, as the ``(1, L)`` ids of one sequence would be);
from numbers, mlx-lm's own generation in the same process gets numpy's.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.model.reroute import reroute


class _RowPositions:
    """numpy, but ``arange(start, stop)`` from an array of row positions gives them per row."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def arange(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], mx.array):  # the engine's offsets: one token per row
            return args[0].reshape(-1, 1)
        return np.arange(*args, **kwargs)


_STAND_IN = _RowPositions()


def install() -> None:
    """Hand every loaded mlx-lm model module that imported numpy as ``np`` the stand-in."""
    home = sys.modules[__name__]
    assert isinstance(home, ModuleType)
    reroute(home, "np", lambda _: _STAND_IN, package="mlx_lm.models")
