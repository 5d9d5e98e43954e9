"""The attention of a family whose layers keep the library's own caches (DeepSeek V4: mlx-lm's
``deepseek_v41`` ``LayerCache``; mlx-vlm's ``deepseek_v4`` ``CacheList`` of a rotating window and
pooling caches), run over the packed step's sequences apart.

Its window, compressed rows, indexer keys and open group live in a ``HeldCaches`` row per
request (``stores/held_caches.py``), not in pages, so each attention module (its class swapped by
``hooks/recurrent_layers.py``, as a recurrent mixer's is) is handed a ``HeldAttentionCache`` and
runs its own code once per sequence of the step, on that sequence's rows and caches, as the
library's generation would call it for one request; everything else of the layer
(hyper-connections, MoE) runs every row together. What the library's text model computes once
per call for its one request and hands every layer (mlx-lm's window rows, mlx-vlm's mask) is made
per sequence by its first layer; cross-layer state mlx-lm passes in its ``shared`` dict (the
compressed rows a source layer made, an index layer's top-k) is kept per sequence. A chunk that
leaves a checkpoint (a prefix-cache block boundary, a verification's snapshot) is run as two
calls cut there, which the caches allow: the output does not depend on where calls are cut
(tests/engine/model/test_deepseek_v4_oracles.py; mlx-vlm's with its overlapping compressors'
caches kept as the reference keeps them, model/overlap_pooling.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from macbatch.engine.model.hooks.recurrent_layers import SequenceRunner
from macbatch.engine.model.recurrent import StateRows
from macbatch.engine.stores.held_caches import HeldCaches, snapshot

_Call = Callable[..., mx.array]


@dataclass
class _Piece:
    """Rows of one chunk that one call per layer takes."""

    first: int  # its first row in the step
    length: int
    chunk: int  # which of the step's chunks
    # the library's state passed from layer to layer within one call (its ``shared``)
    shared: dict[str, Any] = field(default_factory=dict)
    # every layer's caches after this piece, for a checkpoint row (None: it leaves none)
    snapshot: list[Any] | None = None
    # what each of its queries reads of the window, the same in every layer (every layer's
    # window holds the same positions): made by its first layer
    reads: mx.array | None = None


class HeldStep:
    """One packed step's sequences for the held-cache layers: each chunk's caches (a copy of the
    row it reads, or new ones for its first token) and its pieces; the rows it writes already
    name those caches, which the step's layers extend."""

    def __init__(
        self, store: HeldCaches, rows: StateRows, make_cache: Callable[[], list[Any]]
    ) -> None:
        wire = [tuple(int(v) for v in row) for row in rows.wire]
        self.caches = [store.copy_of(read) if read >= 0 else make_cache() for _, read, *_ in wire]
        self.pieces: list[_Piece] = []
        first = 0
        for chunk, (length, _, write, checkpoint, at) in enumerate(wire):
            store.hold(write, self.caches[chunk])
            cut = at if checkpoint >= 0 and 0 < at < length else length
            head = _Piece(first, cut, chunk)
            self.pieces.append(head)
            if checkpoint >= 0:
                head.snapshot = [None] * len(self.caches[chunk])
                store.hold(checkpoint, head.snapshot)
            if cut < length:
                self.pieces.append(_Piece(first + cut, length - cut, chunk))
            first += length


class HeldAttentionCache(SequenceRunner):
    """What one held-cache attention module is handed in a packed step in place of its cache.

    The library's text model reads its first cache's ``offset`` and ``window`` for the one
    request it expects; the packed step has many, so those are a start of nothing here and each
    sequence's own are read from its caches instead."""

    offset = 0
    window = None

    def __init__(self, step: HeldStep, layer: int) -> None:
        self.step = step
        self.layer = layer

    def run(
        self, call: Callable[..., mx.array], x: mx.array, args: tuple, kwargs: dict
    ) -> mx.array:
        """``call`` (the module's own ``__call__``) once per piece, each on its rows of ``x``
        (``[N, 1, H]``) with its sequence's cache and what its queries read."""
        arguments = _convention(call)
        outs = []
        for piece in self.step.pieces:
            cache = self.step.caches[piece.chunk][self.layer]
            rows = x[piece.first : piece.first + piece.length].reshape(1, piece.length, -1)
            out = call(rows, *args, **dict(kwargs, **arguments(call, piece, rows, cache)))
            outs.append(out.reshape(piece.length, 1, -1))
            if piece.snapshot is not None:
                piece.snapshot[self.layer] = snapshot(cache)
        return outs[0] if len(outs) == 1 else mx.concatenate(outs)


def _convention(call: _Call) -> Callable[[_Call, _Piece, mx.array, Any], dict]:
    """What ``call``'s library hands its attention besides the rows: mlx-lm's V4.1 takes a
    ``shared`` dict (``_v41_arguments``), mlx-vlm's V4 a mask (``_vlm_arguments``); read once
    per class."""
    function = getattr(call, "__func__", call)
    if function not in _CONVENTIONS:
        shared = "shared" in inspect.signature(call).parameters
        _CONVENTIONS[function] = _v41_arguments if shared else _vlm_arguments
    return _CONVENTIONS[function]


def _v41_arguments(call: _Call, piece: _Piece, rows: mx.array, cache: Any) -> dict:
    """mlx-lm's ``deepseek_v41`` attention: its position, window rows (its module's
    ``_window_indices``), cache and ``shared`` dict."""
    if piece.reads is None:
        previous = 0 if cache.window is None else cache.window.shape[1]
        window_rows = inspect.getmodule(call)._window_indices  # type: ignore[union-attr]
        length = rows.shape[1]
        piece.reads = window_rows(previous=previous, length=length, window=cache.window_size)[None]
    return dict(start_pos=cache.offset, window_idx=piece.reads, cache=cache, shared=piece.shared)


def _vlm_arguments(call: _Call, piece: _Piece, rows: mx.array, cache: Any) -> dict:
    """mlx-vlm's ``deepseek_v4`` attention: its cache and the window's mask, which its text
    model makes from the first layer's window cache (its module's ``create_attention_mask``)."""
    if piece.reads is None:
        window = cache[0] if hasattr(cache, "caches") else cache
        make_mask = inspect.getmodule(call).create_attention_mask  # type: ignore[union-attr]
        size = call.__self__.config.sliding_window  # type: ignore[attr-defined]
        piece.reads = make_mask(rows, window, window_size=size, return_array=True)
    return dict(mask=piece.reads, cache=cache)


_CONVENTIONS: dict[Any, Callable[[_Call, _Piece, mx.array, Any], dict]] = {}
