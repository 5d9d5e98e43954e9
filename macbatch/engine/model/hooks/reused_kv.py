"""Attention layers handed another layer's K/V as arrays rather than a cache (mlx-lm's AFM 7:
its KV-reuse layers attend over the last cached layer's keys and values, which the inner model
reads with ``keys_and_values()``, and rotate their queries at ``S - L``, the number of keys less
the number of queries): a class swap, so that handed the K/V an engine cache fetched, each row's
queries are rotated at the row's own position and attend over that cache's pages.

Handed the engine's cache's ``fetched`` K/V (a packed step's rows, one token each: ``S - L`` is
0 for every row), the swapped ``__call__`` rotates at the cache's ``offset`` (every row's
position, where the library's keys were rotated) and attends through the cache, as any layer
reading another's K/V does (Gemma 3n's KV-shared layers); handed any other keys (mlx-lm's own
generation's) it is the library's own.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.direct_attention import fetcher_of

_SWAPPED: dict[type, type] = {}


def handed_kv(attentions: Sequence[Any]) -> list[Any]:
    """Those of ``attentions`` whose call takes keys and values instead of a cache."""
    taking = []
    for module in attentions:
        parameters = inspect.signature(type(module).__call__).parameters
        if {"keys", "values"} <= set(parameters) and "cache" not in parameters:
            taking.append(module)
    return taking


def install(attentions: Sequence[Any]) -> None:
    """Swap the class of those of ``attentions`` handed K/V arrays (the family's record names
    the attribute; empty for another family)."""
    for module in handed_kv(attentions):
        swap_call(module, _SWAPPED, _reused_call)


def _reused_call(
    self: Any, x: mx.array, keys: mx.array, values: mx.array, mask: Any = None
) -> mx.array:
    cache = fetcher_of(keys)
    if cache is None:
        return super(type(self), self).__call__(x, keys, values, mask)
    n, length, _ = x.shape
    queries = self.q_proj(x).reshape(n, length, self.n_heads, -1).transpose(0, 2, 1, 3)
    queries = self.q_norm(self.rope(queries, offset=cache.offset))
    out = cache.attend(queries, keys, values, self.scale, None, None)
    return self.out_proj(out.transpose(0, 2, 1, 3).reshape(n, length, -1))
