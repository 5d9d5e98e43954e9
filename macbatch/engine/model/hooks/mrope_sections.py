"""mlx-vlm's sectioned M-RoPE layout cut by slices, so the compiled decode step can trace it.

GLM-4V's text model (mlx-vlm's ``glm4v`` and ``glm4v_moe``: style ``sectioned_even_odd``) lays
out its cos and sin tables by splitting the frequency axis into the temporal, height and width
sections with ``mx.split`` and concatenating the part of each section's position axis. Inside
``mx.compile`` of the engine's packed decode step (worker/compiled_step.py) that split raises
``IndexError: _Map_base::at``, so every request of those families failed its step once
``compile_decode_after`` decode steps had run. ``install`` replaces the layout function in
mlx-vlm's ``rope_utils`` by one that takes the same slices one by one: the same values, bit for
bit (mlx-vlm's own generation in the same process, the tests' oracle, gets them too).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from itertools import accumulate

import mlx.core as mx


def sectioned(values: mx.array, mrope_section: Sequence[int]) -> mx.array:
    """``[3, B, L, F]`` cos or sin as ``[B, 1, L, F]``: frequency section ``i`` (temporal,
    height, width, twice over) from position part ``i % 3``."""
    if len(mrope_section) != 3:
        raise ValueError("sectioned MRoPE expects exactly 3 sections")
    bounds = [0, *accumulate(list(mrope_section) * 2)]
    parts = [values[i % 3][..., a:b] for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return mx.concatenate(parts, axis=-1)[:, None, :, :]


def install() -> None:
    """Patch mlx-vlm's ``rope_utils`` once it is loaded (a model of its code is)."""
    rope_utils = sys.modules.get("mlx_vlm.models.rope_utils")
    if rope_utils is not None and hasattr(rope_utils, "_section_frequency_layout"):
        vars(rope_utils)["_section_frequency_layout"] = sectioned
