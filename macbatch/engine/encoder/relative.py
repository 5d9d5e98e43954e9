"""MPNet's relative-position buckets (T5's scheme, bidirectional): which learned bias each
(query, key) pair of a sequence reads, by how far apart and on which side they are."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

_MAX_DISTANCE = 128  # MPNet's: farther pairs share the last bucket of their side


def relative_buckets(length: int, buckets: int) -> mx.array:
    """[length, length] int32 bucket of key j for query i: half the buckets per side (keys
    after the query in the upper half), each side's first half exact distances, the rest
    logarithmic up to ``_MAX_DISTANCE``."""
    offsets = np.arange(length)[:, None] - np.arange(length)[None, :]  # query - key
    side = buckets // 2
    exact = side // 2
    distance = np.abs(offsets)
    # float32, as MPNet computes it, so the bucket edges fall where its own do
    spread = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(exact))
    far = exact + (spread / np.float32(math.log(_MAX_DISTANCE / exact)) * (side - exact))
    far = np.minimum(far.astype(np.int64), side - 1)
    bucket = np.where(distance < exact, distance, far) + np.where(offsets < 0, side, 0)
    return mx.array(bucket.astype(np.int32))
