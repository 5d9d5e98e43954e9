"""The attention dispatch: mlx-lm's attention hands the engine's caches their layer's queries.

Every mlx-lm model module imports ``scaled_dot_product_attention`` from ``mlx_lm.models.base``
and calls it with the layer's cache. ``install`` replaces that name, in every loaded model module,
by a dispatcher that gives a cache of the engine's (an ``EngineAttention``: the paged step's, or
the adapter's probe) the queries to attend itself, and calls mlx-lm's own function for every
other cache, so plain mlx-lm generation in the same process is unaffected. Sliding windows reach
it through the cache's ``make_mask``, which returns an ``AttentionWindow``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    ) -> AttentionWindow | None:
        """Called by mlx-lm's attention layers in place of their mask: the window alone (None
        without one, as a one-token mask is: mlx-vlm's MiniMax M3 reads any other mask as an
        array)."""
        return None if window_size is None else AttentionWindow(window_size)

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
        selected: mx.array | None = None,
    ) -> mx.array:
        """The layer's attention; ``softcap``: its scores become ``tanh(s / cap) * cap``
        (a layer that caps them inline, ``softcap_attention.py``); ``selected``: the positions
        each row reads (``select_blocks``)."""
        raise NotImplementedError

    def attend_latent(
        self,
        queries: mx.array,
        row: mx.array,
        scale: float,
        value_dim: int,
        selected: mx.array | None = None,
        sinks: mx.array | None = None,
    ) -> mx.array:
        """An MLA layer's attention over its latent rows (``latent_attention.py``): ``queries``
        ``[N, H, 1, Dk]`` (each head's absorbed query, then its roped part), ``row``
        ``[N, 1, 1, Dk]`` (each token's latent then its roped shared key); returns each head's
        latent output ``[N, H, 1, value_dim]`` (the softmax over the rows' leading
        ``value_dim`` columns). ``selected``: the positions each row reads (``select``);
        ``sinks``: each head's extra softmax logit (Hunyuan V4's)."""
        raise NotImplementedError

    def select(self, indexer: Any, x: mx.array, qr: mx.array) -> mx.array | None:
        """A sparse MLA layer's lightning indexer (``model/sparse_indexer.py``): this step's
        indexer keys written, each row's top-k positions ``[N, K]`` (None: all attend densely)."""
        raise NotImplementedError

    def select_blocks(self, indexer: Any, x: mx.array) -> mx.array | None:
        """A block-sparse layer's indexer (Qwen Sparse Attention, ``model/qsa_indexer.py``):
        this step's raw indexer keys written, each row's positions ``[N, K]`` (None: all attend
        densely)."""
        raise NotImplementedError

    def select_pools(self, indexer: Any, x: mx.array, qr: mx.array) -> mx.array | None:
        """A pooling indexer (GLM5-next's, ``model/pool_indexer.py``): this step's indexer keys
        and gates written, each row's positions ``[N, K]`` (None: all attend densely)."""
        raise NotImplementedError

    def __getitem__(self, part: int) -> EngineAttention:
        """mlx-lm's sparse MLA models keep a ``CacheList`` (latent, indexer keys) per layer and
        read its first part's mask; the engine's one cache per layer is both parts."""
        return self


def heads_first(module: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """An mlx-lm attention module's queries, keys and values of ``x`` ``[N, L, H]``, each
    ``[N, heads, L, head_dim]``: what the hooks that swap an attention's class project first."""
    n, length, _ = x.shape
    heads = (module.n_heads, module.n_kv_heads, module.n_kv_heads)
    projections = (module.q_proj, module.k_proj, module.v_proj)
    return tuple(
        p(x).reshape(n, length, h, -1).transpose(0, 2, 1, 3) for p, h in zip(projections, heads)
    )


def _dispatcher(original: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """``original`` (mlx-lm's function, or mlx-vlm's) for every cache but the engine's; a call
    with another cache is noted for the probes watching this thread (``unpaged_calls``)."""

    def dispatch(queries, keys, values, cache, scale, mask, sinks=None):
        if isinstance(cache, EngineAttention):
            window = mask.size if isinstance(mask, AttentionWindow) else None
            return cache.attend(queries, keys, values, scale, window, sinks)
        watches = getattr(_WATCHES, "open", None)
        if watches:
            watches[-1].append(type(cache).__name__)
        return original(queries, keys, values, cache, scale, mask, sinks)

    return dispatch


# per thread, the lists of the probes running on it (the adapter's, loading a model): mlx-lm's
# own generation on another thread meanwhile is none of theirs
_WATCHES = threading.local()


@contextmanager
def unpaged_calls() -> Iterator[list[str]]:
    """The cache types of the attention calls made, while it is open, with a cache not the
    engine's: a layer attending over K/V its cache does not hold, which the probe refuses."""
    calls: list[str] = []
    watches = getattr(_WATCHES, "open", None)
    if watches is None:
        watches = _WATCHES.open = []
    watches.append(calls)
    try:
        yield calls
    finally:
        watches.remove(calls)


def install() -> None:
    """Route ``scaled_dot_product_attention`` in every loaded mlx-lm model module (and mlx-vlm
    model module, once mlx-vlm is loaded: the families whose code is its) through the
    dispatcher (a module patched already, or ``base`` itself, is left as it is)."""
    reroute(base, "scaled_dot_product_attention", _dispatcher)
    vlm_base = sys.modules.get("mlx_vlm.models.base")
    if vlm_base is not None:
        reroute(vlm_base, "scaled_dot_product_attention", _dispatcher)
