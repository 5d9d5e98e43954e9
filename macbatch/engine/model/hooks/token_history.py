"""A layer state of token ids whose fresh value is not zero: a class swap of mlx-vlm's Qwen4-exp
n-gram embeddings (its per-layer embedding, PLE).

mlx-vlm's ``Qwen4ExpNGramEmbedding`` hashes each token with the ``context_len`` tokens before it
and keeps those last ids in its layer's ``ArraysCache`` (an integer array beside the Gated
DeltaNet's states); before a request's first token it reads them as EOS. The engine's state
slots start as zeros (``StateStore``), which would read as token 0. So in the packed step the
slots keep each id plus one: ``install`` swaps each such module's class for a subclass whose
``__call__``, handed the engine's state cache (``StateCache``), reads a zero as EOS and any other
entry less one, runs the module's own code, and stores what it leaves plus one. With any other
cache (mlx-vlm's own generation in the same process) it runs exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.state_calls import StateCache

# what marks a module as an n-gram embedding keeping its context's ids (Qwen4-exp's)
_MARKS = ("ngram_embedding", "context_len", "eos_token_id", "layer_multipliers")
_HISTORY_CLASSES: dict[type, type] = {}


def install(layers: Sequence[Any]) -> None:
    """Swap the class of every n-gram embedding among ``layers``' modules."""
    for layer in layers:
        for _, module in layer.named_modules():
            if all(hasattr(module, name) for name in _MARKS):
                swap_call(module, _HISTORY_CLASSES, _shifted)


def _shifted(self: Any, input_ids: mx.array, cache: Any) -> mx.array:
    original = super(type(self), self).__call__
    if not isinstance(cache, StateCache):
        return original(input_ids, cache)
    for i in _ids(cache):
        cache[i] = mx.where(cache[i] == 0, self.eos_token_id, cache[i] - 1)
    out = original(input_ids, cache)
    for i in _ids(cache):
        cache[i] = cache[i] + 1
    return out


def _ids(cache: StateCache) -> list[int]:
    """The cache's arrays of token ids (its integer ones)."""
    arrays = enumerate(cache.cache)
    return [i for i, a in arrays if a is not None and mx.issubdtype(a.dtype, mx.integer)]
