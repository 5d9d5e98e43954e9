"""The single-request path: a small decode step's forward, compiled with ``mx.compile``.

At one running request a step's device work is small and the host's is most of it: the model's
Python ``__call__`` builds about 170 ops a step, and evaluating them dispatches each to MLX's
stream thread. Compiled, the forward is traced once per shape, replayed from C++ with no Python,
and its elementwise chains are fused (rms_norm's CPU fallback alone is 11 ops): the graph's host
time falls to about a third (docs/engine.md, "The single-request path").

A compiled graph replays its ops with new input arrays, so it is used only where every input of
the step is an array the graph reads at evaluation: a decode-only step (one query row per
sequence, every row sampled) of at most ``MAX_BATCH`` sequences, over an attention backend that
plans from the metadata arrays (the CPU kernel; the Metal kernel plans on the host), for a model
without recurrent layers, in one process. Everything else takes the uncompiled forward, which
computes the same function with the same ops. A runner whose drafter reads each step's hidden
states (an MTP layer: speculative/mtp.py) has them returned too, as a second output of the same
graph (the LM head's input, materialized anyway); one whose drafter reads the target's layer
outputs (DFlash, Eagle-3: speculative/layer_taps.py, recorded as the forward runs, a side effect a
replay would not make) has those returned as further outputs, and recorded again after each
call. So a drafting engine's plain decode steps run compiled as well.

Shapes are buckets: the batch size is exact, the block tables' width is a power of two (the
packer pads it; block 0 is never read), so one request's decode meets a new shape only when its
context doubles. MLX builds each new fused kernel with the C++ compiler on first use (seconds;
cached on disk under ``$TMPDIR/mlx``, and by kernel name in the process; a kernel's code does not
depend on the shapes, so a new shape only retraces), so an engine compiles only after
``EngineConfig.compile_decode_after`` compilable steps: short-lived engines (tests, a few short
requests) never pay for it, and a long-lived one pays it once per machine and model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

import macbatch.metal
from macbatch.engine.model.adapter import ModelAdapter
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.speculative.layer_taps import LayerTaps
from macbatch.engine.stores.pages import KVStore, KVStores
from macbatch.metal import AttentionMetadata

MAX_BATCH = 8  # compile decode steps of at most this many sequences (no gain measured at 32)
# Host copies a traced graph must never read (a backend that did would plan from stale values).
_NO_HOST = np.empty(0, dtype=np.int32)
Shape = tuple[Any, ...]


class DecodeOutputs(NamedTuple):
    """What a compiled decode step returns."""

    logits: mx.array  # [N, V] float32, every row sampled
    hidden: mx.array | None  # [N, 1, H], the last layer's normed states (None: not kept)


class CompiledDecode:
    """A runner's compiled decode forwards, one per shape, over its KV pages."""

    def __init__(
        self,
        adapter: ModelAdapter,
        stores: KVStores,
        after: int,
        keeps_hidden: bool,
        taps: LayerTaps | None,
    ) -> None:
        self._adapter = adapter
        self._stores = stores
        self._after = after
        self._keeps_hidden = keeps_hidden  # the step's hidden states are an output too
        self._taps = taps  # the tapped layers' outputs are outputs too, recorded after each call
        self._steps = 0  # compilable steps so far
        self._shapes: set[Shape] = set()  # the shapes run compiled
        self._template: PackedBatch | None = None  # the batch being traced
        self._windowed = stores.window is not None
        # The pages are the compiled function's state: read at each call, replaced by its
        # outputs (the scatters of this step's K/V), as the uncompiled forward replaces them.
        pages = _page_lists(stores.full) + (
            _page_lists(stores.window) if stores.window is not None else []
        )
        self._compiled = mx.compile(self._forward, inputs=pages, outputs=pages)
        self._head_dims = {s.head_dim for s in adapter.layer_shapes}
        self._block_size = stores.full.block_size

    @property
    def compiled_shapes(self) -> int:
        """How many step shapes have run compiled (tests and benchmarks read it)."""
        return len(self._shapes)

    def forward(self, batch: PackedBatch) -> DecodeOutputs | None:
        """The logits ``[N, V]`` of a compilable decode step (and its hidden states, when kept)
        once ``after`` compilable steps have run uncompiled; None for any other step (the caller
        runs it uncompiled)."""
        shape = self._shape(batch)
        if shape is None:
            return None
        self._steps += 1
        if self._steps <= self._after:
            return None
        self._shapes.add(shape)
        self._template = batch
        try:
            *kept, logits = self._compiled(*_arrays(batch))
        finally:
            self._template = None
        hidden = kept.pop(0) if self._keeps_hidden else None
        if self._taps is not None:
            self._taps.replay(kept)
        # The step's page writes must not be encoded while the step in flight still reads the
        # pages: MLX then cannot write in place and copies every page array. The uncompiled
        # forward is never that far ahead (MLX holds evaluation back to about 100 ops in flight,
        # a layer of any real model); a compiled step of a small model is, whole.
        mx.synchronize()
        return DecodeOutputs(logits, hidden)

    def _shape(self, batch: PackedBatch) -> Shape | None:
        """The compile cache's key for ``batch``, or None when it cannot run compiled."""
        n = batch.num_tokens
        if (
            n > MAX_BATCH
            or batch.cu_seqlens_q.shape[0] != n + 1  # a prefill chunk: more rows than sequences
            or batch.sample_rows.shape[0] != n
            or batch.state_rows is not None
            or batch.image_rows is not None  # image embeddings replace some rows' tokens
            # M-RoPE rows in an image grid (engine/multimodal/qwen_vl.py); 1-D shifted ones are
            # inputs
            or (batch.rope_positions is not None and batch.rope_positions.ndim != 1)
            or not macbatch.metal.traceable(self._head_dims, self._block_size)
        ):
            return None
        window = batch.window_block_tables
        return (
            n,
            batch.block_tables.shape[1],
            None if window is None else window.shape[1],
            batch.token_ids.dtype,
            batch.rope_positions is not None,
            batch.long_rope_rows is not None,
            self._stores.full.num_blocks,  # an elastic pool that grew: new page shapes
            None if self._stores.window is None else self._stores.window.num_blocks,
        )

    def _forward(self, *arrays: mx.array) -> list[mx.array]:
        """Traced once per shape: the uncompiled forward over a batch of the traced arrays (the
        hidden states first when kept, then the tapped layers' outputs, then the logits)."""
        assert self._template is not None
        batch = _rebuilt(self._template, list(arrays), self._windowed)
        hidden = self._adapter.hidden_states(batch, self._stores)
        logits = self._adapter.sampled_logits(hidden, batch)
        assert logits is not None  # every row is sampled
        kept = [hidden] if self._keeps_hidden else []
        if self._taps is not None:
            kept += self._taps.recorded()
        return [*kept, logits]


def _page_lists(store: KVStore) -> list[list[mx.array]]:
    return [store.keys, store.values, store.key_scales, store.value_scales]


def _arrays(batch: PackedBatch) -> list[mx.array]:
    """The step's arrays in a fixed order (``_rebuilt`` reads them back)."""
    arrays = [
        batch.token_ids,
        batch.positions,
        batch.cu_seqlens_q,
        batch.seq_lens,
        batch.block_tables,
        *(batch.kv_write_rows[h] for h in sorted(batch.kv_write_rows)),
    ]
    if batch.window_block_tables is not None and batch.window_write_rows is not None:
        arrays.append(batch.window_block_tables)
        arrays += (batch.window_write_rows[h] for h in sorted(batch.window_write_rows))
    if batch.rope_positions is not None:
        arrays.append(batch.rope_positions)
    if batch.long_rope_rows is not None:
        arrays.append(batch.long_rope_rows)
    return arrays


def _rebuilt(template: PackedBatch, arrays: list[mx.array], windowed: bool) -> PackedBatch:
    """``template`` over ``arrays`` (``_arrays``' order), its attention metadata without host
    copies: only a traceable backend reads it, and it reads the arrays."""
    token_ids, positions, cu, seq_lens, tables, *rest = arrays
    rope = longs = None
    if template.long_rope_rows is not None:
        *rest, longs = rest
    if template.rope_positions is not None:
        *rest, rope = rest
    heads = sorted(template.kv_write_rows)
    write_rows = dict(zip(heads, rest[: len(heads)]))
    window_tables = window_rows = None
    if windowed:
        assert template.window_write_rows is not None
        window_tables, *window = rest[len(heads) :]
        window_rows = dict(zip(sorted(template.window_write_rows), window))
    batch = dataclasses.replace(
        template,
        token_ids=token_ids,
        positions=positions,
        cu_seqlens_q=cu,
        seq_lens=seq_lens,
        block_tables=tables,
        kv_write_rows=write_rows,
        window_block_tables=window_tables,
        window_write_rows=window_rows,
        rope_positions=rope,
        long_rope_rows=longs,
    )
    vars(batch)["attention"] = AttentionMetadata(tables, seq_lens, cu, _NO_HOST, _NO_HOST)
    if window_tables is not None:
        meta = AttentionMetadata(window_tables, seq_lens, cu, _NO_HOST, _NO_HOST)
        vars(batch)["window_attention"] = meta
    return batch


def compiled_decode(
    adapter: ModelAdapter,
    stores: KVStores,
    after: int | None,
    distributed: bool,
    keeps_hidden: bool = False,
    taps: LayerTaps | None = None,
) -> CompiledDecode | None:
    """The runner's compiled decode step, or None where none is used: turned off (``after``
    None), a distributed group (followers run their own forward), a model with recurrent
    layers (their state rows are gathered and scattered by host-planned slots), a sparse one
    (its indexer's selection is planned on the host from the step's lengths) or a chunked one
    (its chunks' sequences are too, model/attention_chunks.py), or one whose forward evaluates
    between its layers (``Family.evaluates_between_layers``: a trace cannot).
    ``keeps_hidden``: each step's hidden states are returned too (a drafter reads them);
    ``taps``: the target's layer outputs a drafter records, returned and recorded too."""
    if after is None or distributed or adapter.hybrid or adapter.sparse or adapter.chunked:
        return None
    if adapter.family.evaluates_between_layers:
        return None
    return CompiledDecode(adapter, stores, after, keeps_hidden, taps)
