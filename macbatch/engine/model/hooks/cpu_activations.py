"""The logistic function in arithmetic MLX's CPU compiler vectorizes, for the engine's recurrent
layers on the CPU.

MLX's CPU build on x86 evaluates ``exp`` one element at a time (its SIMD types are ARM's), so
``mx.sigmoid`` and ``nn.silu`` cost about 15 ns an element here: on the Qwen3.5-shaped benchmark
model a 512-token prompt's SiLUs (the convolution's output, the gated norm, the MLP) took about
90 ms of a Gated DeltaNet layer's 360. ``sigmoid`` below is the same function from multiplies,
adds and bit shifts (``exp`` by Cody and Waite's range reduction and a degree-7 Taylor
polynomial on ``|r| <= ln 2 / 2``), compiled into one fused kernel: 3.5x faster, and within
2e-7 of the float64 value (MLX's own: 9e-7).

Only the engine's step uses it: inside ``gated_delta.prefill`` / ``decode`` on the CPU, the
model modules' ``swiglu``, ``precise_swiglu`` and ``nn.silu`` route here (``install``); mlx-lm's
own generation in the same process, the tests' oracle and the benchmarks' peer, keeps MLX's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.model.hooks import gated_delta

_LN2_HI, _LN2_LO = 0.693145751953125, 1.428606765330187e-06  # ln 2 = hi + lo, hi exact
_LOG2_E = 1.4426950408889634
_TAYLOR = tuple(1.0 / f for f in (5040, 720, 120, 24, 6, 2, 1, 1))  # e^r, highest power first


@mx.compile
def sigmoid(x: mx.array) -> mx.array:
    """``1 / (1 + e^-x)``, in float32, returned in ``x``'s dtype."""
    wide = x.astype(mx.float32)
    y = mx.maximum(-mx.abs(wide), -87.0)  # e^y with y <= 0 stays a normal float
    n = -((0.5 - y * _LOG2_E).astype(mx.int32))  # round(y / ln 2): truncation of a positive
    whole = n.astype(mx.float32)
    r = (y - whole * _LN2_HI) - whole * _LN2_LO
    p = r * _TAYLOR[0] + _TAYLOR[1]
    for c in _TAYLOR[2:]:
        p = p * r + c
    e = p * mx.view((n + 127) << 23, mx.float32)  # e^-|x| = e^r 2^n
    positive = (wide >= 0).astype(mx.float32)  # 1 / (1 + e) for x >= 0, e / (1 + e) below
    return ((e + positive * (1.0 - e)) / (1.0 + e)).astype(x.dtype)


@mx.compile
def silu(x: mx.array) -> mx.array:
    return x * sigmoid(x)


@mx.compile
def _swiglu(gate: mx.array, x: mx.array) -> mx.array:
    return silu(gate) * x


@mx.compile
def _precise_swiglu(h: mx.array, gate: mx.array, x: mx.array) -> mx.array:
    return (silu(gate.astype(mx.float32)) * x.astype(mx.float32)).astype(h.dtype)


def _ours() -> bool:
    return gated_delta.running() and not gated_delta.on_gpu()


def _dispatcher(original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        return (ours if _ours() else original)(*args, **kwargs)

    return dispatch


class _NnWithOurSilu:
    """``mlx.nn`` as a model module sees it, with ``silu`` dispatched."""

    def __init__(self) -> None:
        self.silu = _dispatcher(nn.silu, silu)

    def __getattr__(self, name: str) -> Any:
        return getattr(nn, name)


def install() -> None:
    """Route ``swiglu``, ``precise_swiglu`` and ``nn.silu`` in every loaded mlx-lm model module
    through dispatchers (MLX's own functions outside the engine's recurrent layers)."""
    from mlx_lm.models import activations

    ours: dict[str, Callable[..., Any]] = {"swiglu": _swiglu, "precise_swiglu": _precise_swiglu}
    proxy = _NnWithOurSilu()
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models.") or module is activations:
            continue
        found = vars(module)
        for function, replacement in ours.items():
            if found.get(function) is getattr(activations, function):
                found[function] = _dispatcher(getattr(activations, function), replacement)
        if found.get("nn") is nn:
            found["nn"] = proxy
