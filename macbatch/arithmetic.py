"""Integer arithmetic the engine and the kernels' planners share."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

Count = TypeVar("Count", int, "np.ndarray")


def ceil_div(numerator: Count, denominator: int) -> Count:
    """How many ``denominator``-sized pieces hold ``numerator`` items (blocks for tokens, tiles for
    rows), elementwise for an integer array: the quotient rounded up, in integers (no float
    rounding at any size)."""
    return -(-numerator // denominator)
