"""Attention as pure functions on arrays: the engine calls `paged_attention` once per layer.

On Metal the custom kernel is used once it has passed its start-up self-test; everywhere else (and
whenever ``MACBATCH_ATTENTION=reference``) the pure-MLX reference runs. This package never imports
the engine.
"""

from macbatch.metal.reference import paged_attention_reference

paged_attention = paged_attention_reference

__all__ = ["paged_attention", "paged_attention_reference"]
