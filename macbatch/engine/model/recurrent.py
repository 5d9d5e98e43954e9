"""Recurrent layers (Gated DeltaNet, Mamba 2, short convolutions) inside the packed step.

A hybrid model's recurrent layer keeps a fixed-size state per sequence (mlx-lm's ``ArraysCache``:
a convolution window, an SSM or delta-rule matrix) instead of K/V per token. Every running request
owns one *slot* of every recurrent layer's state (``StateStore``), held from its first scheduled
chunk until it finishes or is preempted (a preempted request recomputes from its first token).

The packed step feeds the model one token per batch row; attention layers read their pages per
row, but a recurrent layer must see each request's tokens in order. So each recurrent layer (its
class swapped by ``hooks/recurrent_layers.py``) hands its own mlx-lm code to ``PagedStateCache``,
which runs it on the step's requests as mlx-lm would batch them: the rows of one-token chunks
(every decode) together as a batch of sequences of length 1; the short chunks (under
``BATCHED_BELOW`` tokens: a speculating decode's verification, 2 to ``1 + k`` rows) together as
one batch per length and checkpoint cut (in one call that leaves the state at the cut as well,
``state_cut.py``, where the layer allows it; else in one call per side of the cut); and each
longer prefill chunk as one sequence; each
from its slot's state (zeros for a chunk that starts a request), in groups of at most
``GROUP_BYTES`` of state. Their slots then point at the new states (the
store keeps where each slot's latest state is: ``state_store.py``), and their outputs go back to
the step's rows. No other slot is read or written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.model import state_cut
from macbatch.engine.model.hooks import gated_delta
from macbatch.engine.model.hooks.depthwise_conv import ShiftedConv1d
from macbatch.engine.model.hooks.recurrent_layers import SequenceRunner
from macbatch.engine.stores.state_store import StateStore


@dataclass(frozen=True)
class StateChunk:
    """Where one chunk's sequence starts from and what it leaves behind."""

    read: int  # the slot whose state it starts from; -1: zeros (its first token)
    write: int  # its request's slot, which receives the state after the chunk
    # A checkpoint slot that receives the state after the chunk's first ``checkpoint_at`` tokens
    # (a block boundary of the prefix cache); -1: none.
    checkpoint: int = -1
    checkpoint_at: int = 0


@dataclass(frozen=True)
class ChunkBatch:
    """Chunks of one length and one checkpoint cut, run through the layer as one batch of
    equal-length sequences (a single long chunk is a batch of one)."""

    chunks: tuple[tuple[int, StateChunk], ...]  # (first row, plan), in row order
    length: int
    cut: int  # tokens up to the checkpoint (the whole chunk without one)
    checkpointed: bool  # every chunk leaves a checkpoint after ``cut`` tokens, or none does
    reads: tuple[Stretch, ...]  # the chunks' read slots, as stretches
    rows: mx.array | None  # the chunks' rows in order; None: consecutive from the first's

    @classmethod
    def of(cls, chunks: Sequence[tuple[int, int, StateChunk]]) -> ChunkBatch:
        """``chunks``: (first row, length, plan) of equal length and cut, in row order."""
        length, plan = chunks[0][1], chunks[0][2]
        firsts = [first for first, _, _ in chunks]
        consecutive = firsts == list(range(firsts[0], firsts[0] + length * len(firsts), length))
        index = np.concatenate([np.arange(first, first + length) for first in firsts])
        return cls(
            chunks=tuple((first, p) for first, _, p in chunks),
            length=length,
            cut=_cut(length, plan),
            checkpointed=plan.checkpoint >= 0,
            reads=stretches([p.read for _, _, p in chunks]),
            rows=None if consecutive else mx.array(index.astype(np.int32)),
        )

    def inputs(self, x: mx.array, start: int, stop: int) -> mx.array:
        """Chunks ``start`` to ``stop - 1`` of ``x`` (``[N, 1, ...]`` rows: GLM5-next's hold each
        of their residual streams) as ``[n, length, ...]``."""
        n, length = stop - start, self.length
        if self.rows is None:
            first = self.chunks[0][0] + start * length
            part = x[first : first + n * length]
        else:
            part = x[self.rows[start * length : stop * length]]
        return part.reshape(n, length, *x.shape[2:])


@dataclass(frozen=True)
class StateRows:
    """How one step's rows map onto sequences for the recurrent layers (built by the packer).

    Pieces: the one-token chunks as one batch, then each batch of longer chunks. Writes, in
    order: every piece's final state into its requests' slots, then the checkpoints (the
    singles' first)."""

    singles: mx.array | None  # [S] rows of one-token chunks; None: rows 0..S-1
    num_singles: int
    # The slots the singles start from, as stretches of consecutive slots (first single, first
    # slot, length); first slot -1: a stretch that starts its requests (zero state).
    single_reads: tuple[Stretch, ...]
    single_marked: tuple[int, ...]  # which singles (indices) leave a checkpoint
    batches: tuple[ChunkBatch, ...]  # the others, by their first chunk's row
    write_slots: tuple[int, ...]  # every slot written, in the order above
    # The writes as stretches of consecutive slots within one piece's states: (piece, first row
    # in it, first slot, length). Pieces: the singles, each batch, the singles' checkpoints, each
    # batch's checkpoints (those that are there).
    write_stretches: tuple[tuple[int, int, int, int], ...]
    restore: mx.array | None  # rows from piece order; None: pieces are already in row order
    # What it was built from, one row per chunk: (length, read, write, checkpoint,
    # checkpoint_at). A distributed step broadcasts this; every rank builds the rest from it.
    wire: np.ndarray

    @classmethod
    def build(cls, lengths: np.ndarray, plans: Sequence[StateChunk]) -> StateRows:
        """``lengths`` and ``plans`` of the step's chunks, in row order."""
        rows = [(n, p.read, p.write, p.checkpoint, p.checkpoint_at) for n, p in zip(lengths, plans)]
        return cls.from_wire(np.array(rows, np.int32).reshape(-1, 5))

    @classmethod
    def from_wire(cls, wire: np.ndarray) -> StateRows:
        """The rows of a step from its ``wire`` form."""
        lengths = wire[:, 0]
        plans = [StateChunk(*map(int, row[1:])) for row in wire]
        first_rows = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        single = lengths == 1
        single_rows = first_rows[single]
        num_singles = int(single.sum())
        singles = [p for p, one in zip(plans, single) if one]
        batches = _batches(
            [(int(first_rows[i]), int(lengths[i]), plans[int(i)]) for i in np.flatnonzero(~single)]
        )
        pieces = [single_rows] + [
            np.arange(first, first + b.length) for b in batches for first, _ in b.chunks
        ]
        order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        marked = [i for i, p in enumerate(singles) if p.checkpoint >= 0]
        batch_plans = [[p for _, p in b.chunks] for b in batches]
        writes = [p.write for p in singles] + [p.write for ps in batch_plans for p in ps]
        writes += [singles[i].checkpoint for i in marked]
        cut_plans = [ps for b, ps in zip(batches, batch_plans) if b.checkpointed]
        writes += [p.checkpoint for ps in cut_plans for p in ps]
        sizes = [num_singles] if num_singles else []
        sizes += [len(b.chunks) for b in batches] + ([len(marked)] if marked else [])
        sizes += [len(b.chunks) for b in batches if b.checkpointed]
        singles_in_place = bool((single_rows == np.arange(num_singles)).all())
        in_order = bool((order == np.arange(len(order))).all())
        return cls(
            singles=None if singles_in_place else mx.array(single_rows.astype(np.int32)),
            num_singles=num_singles,
            single_reads=stretches([p.read for p in singles]),
            single_marked=tuple(marked),
            batches=batches,
            write_slots=tuple(writes),
            write_stretches=_piece_stretches(writes, sizes),
            restore=None if in_order else mx.array(np.argsort(order).astype(np.int32)),
            wire=wire,
        )


class PagedStateCache(SequenceRunner):
    """What a recurrent layer is handed during a packed forward in place of an ``ArraysCache``:
    the store layer whose slots hold its state, and the step's rows."""

    def __init__(
        self,
        store: StateStore,
        layer: int,
        rows: StateRows,
        positions: mx.array | None = None,
    ) -> None:
        self.store = store
        self.layer = layer
        self.rows = rows
        # the step's per-row positions (the attention caches' ``offset``): a layer handed them
        # (Bailing's GLA layers rotate by the attention layer's offset) gets each of its
        # sequences' first position instead
        self.positions = positions

    def make_mask(self, n: int, *args: Any, **kwargs: Any) -> None:
        """No padding anywhere: every sequence a recurrent layer sees is whole."""
        return None

    def run(self, call: LayerCall, x: mx.array, args: tuple, kwargs: dict) -> mx.array:
        """``call`` (the layer's own ``__call__``) over the step's sequences; ``x``: ``[N, 1, H]``
        rows, the result in the same rows."""
        rows = self.rows
        outs: list[mx.array] = []
        finals: list[Piece] = []  # the state each piece leaves
        checkpoints: list[Piece] = []
        if rows.num_singles:
            singles: Piece = []
            marked: Piece = []
            for start, stop in self._groups(rows.num_singles):
                with gated_delta.decode():  # one read of each state where mlx-lm has no kernel
                    out, state = self._singles(call, x, start, stop, args, kwargs)
                outs.append(out)
                singles.append((stop - start, state))
                local = [i - start for i in rows.single_marked if start <= i < stop]
                if local:
                    picked = mx.array(local, dtype=mx.int32)
                    marked.append((len(local), [a[picked] for a in state]))
            finals.append(singles)
            if marked:
                checkpoints.append(marked)
        for batch in rows.batches:
            states: Piece = []
            cuts: Piece = []
            for start, stop in self._groups(len(batch.chunks)):
                out, state, checkpoint = self._batch(call, x, batch, start, stop, args, kwargs)
                outs.append(out)
                states.append((stop - start, state))
                if checkpoint is not None:
                    cuts.append((stop - start, checkpoint))
            finals.append(states)
            if cuts:
                checkpoints.append(cuts)
        self._write_back(finals + checkpoints)
        out = outs[0] if len(outs) == 1 else _joined(outs, axis=0)
        return out if rows.restore is None else _each(out, lambda a: a[rows.restore])

    def _groups(self, n: int) -> list[tuple[int, int]]:
        """``n`` sequences cut into groups whose state arrays stay under ``GROUP_BYTES``."""
        widest = max(
            int(np.prod(a.shape[1:])) * a.dtype.size for a in self.store.states[self.layer]
        )
        per = max(1, GROUP_BYTES // widest)
        return [(start, min(start + per, n)) for start in range(0, n, per)]

    def _read(self, reads: Sequence[Stretch], start: int, stop: int) -> Any:
        """A new cache holding the states of sequences ``start`` to ``stop - 1`` of ``reads``
        (zeros where a sequence starts its request)."""
        cache = _new_cache(len(self.store.states[self.layer]))
        picked = [
            self.store.read(self.layer, slot + lo - first if slot >= 0 else -1, hi - lo)
            for first, slot, n in reads
            if (lo := max(first, start)) < (hi := min(first + n, stop))
        ]
        for e in range(len(picked[0])):
            parts = [p[e] for p in picked]
            cache[e] = parts[0] if len(parts) == 1 else mx.concatenate(parts)
        return cache

    def _singles(
        self, call: LayerCall, x: mx.array, start: int, stop: int, args: tuple, kwargs: dict
    ) -> tuple[mx.array, list[mx.array]]:
        """One-token chunks ``start`` to ``stop - 1`` as a batch of length-1 sequences, each
        from its read slot (zeroed where the chunk starts its request)."""
        rows, cache = self.rows, self._read(self.rows.single_reads, start, stop)

        def take(a: mx.array) -> mx.array:
            if rows.singles is not None:
                return a[rows.singles[start:stop]]
            return a if stop - start == a.shape[0] else a[start:stop]

        rest, named = self._per_call(args, kwargs, x.shape[0], lambda a: take(a)[:, None], 0, 1)
        out = call(take(x), *rest, **dict(named, cache=cache))
        return out, list(cache.cache)

    def _batch(
        self,
        call: LayerCall,
        x: mx.array,
        batch: ChunkBatch,
        start: int,
        stop: int,
        args: tuple,
        kwargs: dict,
    ) -> tuple[mx.array, list[mx.array], list[mx.array] | None]:
        """Chunks ``start`` to ``stop - 1`` of ``batch`` as one batch of sequences from their
        read slots (an empty cache when every one starts its request: the layer's own zeros),
        cut where they leave a checkpoint; returns their output rows, final states and
        checkpoints."""
        plans = batch.chunks[start:stop]
        if any(plan.read >= 0 for _, plan in plans):
            cache = self._read(batch.reads, start, stop)
        else:
            cache = _new_cache(len(self.store.states[self.layer]))
        inputs = batch.inputs(x, start, stop)
        rows = (stop - start) * batch.length
        arrays = len(self.store.states[self.layer])

        def take(a: mx.array) -> mx.array:
            part = batch.inputs(a.reshape(a.shape[0], 1, -1), start, stop)
            return part.reshape(*part.shape[:2], *a.shape[1:])

        def part(inputs: mx.array, lo: int, hi: int) -> Any:
            rest, named = self._per_call(args, kwargs, x.shape[0], take, lo, hi)
            return call(inputs, *rest, **dict(named, cache=cache))

        if batch.checkpointed and batch.cut < batch.length and _cuts_in_one_call(call, arrays):
            with gated_delta.prefill(), state_cut.cut_at(batch.cut) as cut:
                out = part(inputs, 0, batch.length)
            final = list(cache.cache)
            return _rows(out, rows), final, cut.after_cut(final)
        outs, checkpoint = [], None
        for lo, hi in ((0, batch.cut), (batch.cut, batch.length)):
            if hi > lo:
                # one token: the decode step's single read of each state; more: chunked where
                # long enough (mlx-lm's own steps below that)
                mode = gated_delta.decode() if hi - lo == 1 else gated_delta.prefill()
                with mode:
                    outs.append(part(inputs[:, lo:hi], lo, hi))
            if batch.checkpointed and hi == batch.cut:
                checkpoint = list(cache.cache)
        out = outs[0] if len(outs) == 1 else _joined(outs, axis=1)
        return _rows(out, rows), list(cache.cache), checkpoint

    def _per_call(
        self,
        args: tuple,
        kwargs: dict,
        n: int,
        take: Callable[[mx.array], mx.array],
        lo: int,
        hi: int,
    ) -> tuple[tuple, dict]:
        """``args`` and ``kwargs`` for one call over tokens ``lo`` to ``hi - 1`` of some
        sequences, whose rows ``take`` gathers from ``[n, ...]`` as ``[sequences, tokens,
        ...]``: the step's positions become each sequence's first position there, any other
        array of the step's ``n`` rows as ``x`` has them (``[n, 1, ...]``: a residual passed
        from layer to layer, RWKV-7's first values) those rows."""

        def one(value: Any) -> Any:
            if self.positions is not None and value is self.positions:
                return take(value)[:, lo]
            if isinstance(value, mx.array) and value.ndim > 1 and value.shape[:2] == (n, 1):
                return take(value[:, 0])[:, lo:hi]
            return value

        return tuple(one(a) for a in args), {name: one(v) for name, v in kwargs.items()}

    def _write_back(self, pieces: list[Piece]) -> None:
        """Every new state to its slot, per stretch of consecutive slots within a group: the
        store points them at the rows of this step's outputs (``StateStore.write``)."""
        for piece, first, slot, n in self.rows.write_stretches:
            for offset, state, lo, hi in _segments(pieces[piece], first, n):
                self.store.write(self.layer, slot + offset, state, lo, hi - lo)


LayerCall = Callable[..., mx.array]
# A piece's states as groups of rows: (rows, one array per state) each, in row order.
Piece = list[tuple[int, list[mx.array]]]
# Chunks shorter than this run together, one batch per length and checkpoint cut (mlx-lm's
# recurrence steps through them a token at a time, so one sequence per call is mostly calls);
# longer ones run alone: the chunked recurrence (``gated_delta.CHUNK`` tokens at a time) already
# runs them as matrix products, and a batch would multiply its temporaries.
BATCHED_BELOW = gated_delta.CHUNK
# A step's batches of sequences run in groups whose state arrays stay under this many bytes.
# MLX's stream thread allocates from a glibc thread arena, whose heaps hold 64 MiB at most:
# 32-row buffers of Qwen3.5-sized Gated DeltaNet states (1 MiB a row) spilled into new heaps,
# unmapped again once empty, so the kernel zero-filled them page by page every step (15,000
# page faults a 4-layer step); in groups of 16 MiB (with the compiled decode update) none.
GROUP_BYTES = 16 << 20
Stretch = tuple[int, int, int]  # (first index, first slot, length)


def stretches(slots: Sequence[int]) -> tuple[Stretch, ...]:
    """``slots`` cut into stretches of consecutive slots (a slot -1 joins only other -1s), so a
    step reads and writes each stretch as one slice."""
    out: list[list[int]] = []
    for i, slot in enumerate(slots):
        last = out[-1] if out else None
        if last is not None and _continues(last[1], last[2], slot):
            last[2] += 1
        else:
            out.append([i, slot, 1])
    return tuple((i, slot, n) for i, slot, n in out)


def _cut(length: int, plan: StateChunk) -> int:
    """Tokens before a chunk's checkpoint (the whole chunk when it leaves none, or leaves it at
    its end)."""
    inside = plan.checkpoint >= 0 and 0 < plan.checkpoint_at < length
    return plan.checkpoint_at if inside else length


def _batches(chunks: Sequence[tuple[int, int, StateChunk]]) -> tuple[ChunkBatch, ...]:
    """``chunks`` (first row, length, plan; in row order) as batches: the short ones of equal
    length and cut together, each long one alone; ordered by their first rows."""
    keyed: dict[tuple[int, int, bool] | int, list[tuple[int, int, StateChunk]]] = {}
    for i, (first, length, plan) in enumerate(chunks):
        key = (length, _cut(length, plan), plan.checkpoint >= 0) if length < BATCHED_BELOW else i
        keyed.setdefault(key, []).append((first, length, plan))
    return tuple(ChunkBatch.of(group) for group in keyed.values())


def _segments(piece: Piece, first: int, n: int) -> list[tuple[int, list[mx.array], int, int]]:
    """Rows ``first`` to ``first + n - 1`` of ``piece`` as (offset from ``first``, group states,
    first row in the group, end row in the group), one per group they touch."""
    out, start = [], 0
    for size, state in piece:
        lo, hi = max(first, start), min(first + n, start + size)
        if lo < hi:
            out.append((lo - first, state, lo - start, hi - start))
        start += size
    return out


def _continues(first: int, length: int, slot: int) -> bool:
    return first < 0 and slot < 0 or first >= 0 and slot == first + length


def _piece_stretches(
    writes: Sequence[int], sizes: Sequence[int]
) -> tuple[tuple[int, int, int, int], ...]:
    """The stretches of ``writes`` within each piece (``sizes``: the pieces' lengths, in order)."""
    out, start = [], 0
    for piece, size in enumerate(sizes):
        out += [(piece, i, slot, n) for i, slot, n in stretches(writes[start : start + size])]
        start += size
    return tuple(out)


def _cuts_in_one_call(call: LayerCall, arrays: int) -> bool:
    """Whether the layer behind ``call``, with ``arrays`` state arrays, leaves its state at a
    cut inside one call (``state_cut``): one depthwise convolution and, where it has a state
    beyond the convolution's window, a recurrence whose dispatcher splits at the cut (Gated
    DeltaNet, Mamba 2); any other runs a cut chunk as two calls."""
    layer = getattr(call, "__self__", None)  # None: not a layer's method
    if layer is None:
        return False
    key = (type(layer), arrays)
    if key not in _ONE_CALL_CUTS:
        modules = [module for _, module in layer.named_modules()]
        convs = sum(isinstance(module, ShiftedConv1d) for module in modules)
        routed = any(state_cut.routes(type(module)) for module in modules)
        _ONE_CALL_CUTS[key] = convs == 1 and (arrays == 1 or arrays == 2 and routed)
    return _ONE_CALL_CUTS[key]


# by layer class and state arrays (its recurrent instances are alike)
_ONE_CALL_CUTS: dict[tuple[type, int], bool] = {}


def _each(out: Any, f: Callable[[mx.array], mx.array]) -> Any:
    """``f`` of a layer's output, or of each array of a layer's tuple of outputs (RWKV-7's
    hidden states and first values)."""
    if isinstance(out, tuple):
        return tuple(None if a is None else f(a) for a in out)
    return f(out)


def _rows(out: Any, rows: int) -> Any:
    """A call's ``[sequences, tokens, ...]`` output as the step's ``rows`` rows."""
    return _each(out, lambda a: a.reshape(rows, 1, *a.shape[2:]))


def _joined(outs: list[Any], axis: int) -> Any:
    """Outputs of several calls joined along ``axis``, a tuple's each part apart."""
    if isinstance(outs[0], tuple):
        return tuple(
            None if parts[0] is None else mx.concatenate(list(parts), axis=axis)
            for parts in zip(*outs)
        )
    return mx.concatenate(outs, axis=axis)


def _new_cache(size: int) -> Any:
    """An empty ``ArraysCache`` of ``size`` arrays, as the layer's own code expects (mlx-lm's,
    answering mlx-vlm's calls too: ``state_calls.py``)."""
    from macbatch.engine.model.state_calls import StateCache

    return StateCache(size)
