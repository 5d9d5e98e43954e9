"""Attention layers that call ``mx.fast.scaled_dot_product_attention`` themselves (mlx-vlm's
Phi-3-Vision, Moondream 2, Phi-4-multimodal ...), not the ``scaled_dot_product_attention`` of
their library's ``base`` that ``attention.py`` reroutes: the call takes no cache, so the
engine's pages cannot be named by it.

Such a layer hands the K/V its cache's ``update_and_fetch`` just returned straight to the call.
``install`` replaces the ``mx`` each decoder layer's module reads by a view of mlx.core whose
``fast.scaled_dot_product_attention`` knows those arrays: called with the keys the engine's
cache last fetched on this thread (``fetched``), the cache attends over its pages; called with
any other keys (a vision tower's, mlx-lm's own generation's), it is MLX's own.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import mlx.core as mx

from macbatch.engine.model.hooks.attention import AttentionWindow, EngineAttention

_LAST = threading.local()  # the engine cache whose update_and_fetch returned last, per thread


def fetched(cache: EngineAttention) -> None:
    """Notes that ``cache``'s ``update_and_fetch`` returned its ``fetched`` K/V just now."""
    _LAST.cache = cache


def fetcher_of(keys: mx.array) -> EngineAttention | None:
    """The engine cache whose ``update_and_fetch`` returned ``keys`` last on this thread, or
    None (keys of mlx-lm's own caches, or fetched by a cache before it)."""
    cache: Any = getattr(_LAST, "cache", None)
    fetched_keys = getattr(cache, "fetched", None) or (None,)
    return cache if fetched_keys[0] is keys else None


def _attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float,
    mask: Any = None,
    sinks: Any = None,
    **kwargs: Any,
) -> mx.array:
    """MLX's fused attention, or the engine cache's over its pages where ``keys`` are what
    that cache fetched."""
    cache: Any = fetcher_of(keys)
    if cache is None:
        extra = {} if sinks is None else {"sinks": sinks}
        return mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask=mask, **extra, **kwargs
        )
    window = mask.size if isinstance(mask, AttentionWindow) else None
    return cache.attend(queries, keys, values, scale, window, sinks)


class _Fast:
    """``mx.fast`` with its attention dispatched."""

    scaled_dot_product_attention = staticmethod(_attention)

    def __getattr__(self, name: str) -> Any:
        return getattr(mx.fast, name)


class _Core:
    """``mlx.core`` with ``fast`` dispatched (``_Fast``)."""

    fast = _Fast()

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)


_VIEW = _Core()


def install(layers: Sequence[Any]) -> None:
    """Give the dispatching view to the model modules (mlx-lm's or mlx-vlm's) of ``layers``'
    submodules whose code calls ``mx.fast.scaled_dot_product_attention`` (a module given it
    already is left as it is)."""
    names = {type(m).__module__ for layer in layers for _, m in layer.named_modules()}
    for name in sorted(names):
        module = sys.modules.get(name)
        ours = name.startswith(("mlx_lm.models.", "mlx_vlm.models."))
        if ours and module is not None and vars(module).get("mx") is mx and _calls(module):
            vars(module)["mx"] = _VIEW


def _calls(module: ModuleType) -> bool:
    """Whether ``module``'s code calls MLX's fused attention by its full name."""
    try:
        return "mx.fast.scaled_dot_product_attention" in inspect.getsource(module)
    except (OSError, TypeError):  # no source to read: left as it is
        return False
