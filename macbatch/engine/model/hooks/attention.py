"""The attention dispatch: mlx-lm's attention hands the engine's caches their layer's queries.

Every mlx-lm model module imports ``scaled_dot_product_attention`` from ``mlx_lm.models.base``
and calls it with the layer's cache. ``install`` replaces that name, in every loaded model module,
by a dispatcher that gives a cache of the engine's (an ``EngineAttention``: the paged step's, or
the adapter's probe) the queries to attend itself, and calls mlx-lm's own function for every
other cache, so plain mlx-lm generation in the same process is unaffected. Sliding windows reach
it through the cache's ``make_mask``, which returns an ``AttentionWindow``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models import base

from macbatch.engine.model.reroute import reroute


@dataclass(frozen=True)
class AttentionWindow:
    """What an engine cache's ``make_mask`` hands to attention: the layer's sliding window."""

    size: int | None


class EngineAttention:
    """A layer cache whose attention the engine computes (a base class the dispatcher knows)."""

    offset: mx.array  # each row's position, as mlx-lm's RoPE reads a cache's offset

    def make_mask(
        self, n: int, return_array: bool = False, window_size: int | None = None
    ) -> AttentionWindow:
        """Called by mlx-lm's attention layers in place of their mask: the window alone."""
        return AttentionWindow(window_size)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """The layer's K/V of this step written (as mlx-lm's caches do), then handed back."""
        raise NotImplementedError

    def attend(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        scale: float,
        window: int | None,
        sinks: Any,
        softcap: float | None = None,
    ) -> mx.array:
        """The layer's attention; ``softcap``: its scores become ``tanh(s / cap) * cap``
        (a layer that caps them inline, ``softcap_attention.py``)."""
        raise NotImplementedError

    def attend_latent(
        self, queries: mx.array, row: mx.array, scale: float, value_dim: int
    ) -> mx.array:
        """An MLA layer's attention over its latent rows (``latent_attention.py``): ``queries``
        ``[N, H, 1, Dk]`` (each head's absorbed query, then its roped part), ``row``
        ``[N, 1, 1, Dk]`` (each token's latent then its roped shared key); returns each head's
        latent output ``[N, H, 1, value_dim]`` (the softmax over the rows' leading
        ``value_dim`` columns)."""
        raise NotImplementedError


def _dispatch(queries, keys, values, cache, scale, mask, sinks=None):
    if isinstance(cache, EngineAttention):
        window = mask.size if isinstance(mask, AttentionWindow) else None
        return cache.attend(queries, keys, values, scale, window, sinks)
    return base.scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)


def install() -> None:
    """Route ``scaled_dot_product_attention`` in every loaded mlx-lm model module through
    ``_dispatch`` (a module patched already, or ``base`` itself, is left as it is)."""
    reroute(base, "scaled_dot_product_attention", lambda _: _dispatch)
