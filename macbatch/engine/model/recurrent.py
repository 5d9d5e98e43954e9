"""Recurrent layers (Gated DeltaNet, Mamba 2, short convolutions) inside the packed step.

A hybrid model's recurrent layer keeps a fixed-size state per sequence (mlx-lm's ``ArraysCache``:
a convolution window, an SSM or delta-rule matrix) instead of K/V per token. Every running request
owns one *slot* of every recurrent layer's state (``StateStore``), held from its first scheduled
chunk until it finishes or is preempted (a preempted request recomputes from its first token).

The packed step feeds the model one token per batch row; attention layers read their pages per
row, but a recurrent layer must see each request's tokens in order. So each recurrent layer (its
class swapped by ``hooks/recurrent_layers.py``) hands its own mlx-lm code to ``PagedStateCache``,
which runs it on the step's requests as mlx-lm would batch them: the rows of one-token chunks
(every decode) together as a batch of sequences of length 1, and each longer prefill chunk as one
sequence, each from its slot's state (zeros for a chunk that starts a request); the one-token rows
in groups of at most ``GROUP_BYTES`` of state. Their slots then point at the new states (the
store keeps where each slot's latest state is: ``state_store.py``), and their outputs go back to
the step's rows. No other slot is read or written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.model.hooks import gated_delta
from macbatch.engine.model.hooks.recurrent_layers import SequenceRunner
from macbatch.engine.worker.state_store import StateStore


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
class StateRows:
    """How one step's rows map onto sequences for the recurrent layers (built by the packer).

    Pieces: the one-token chunks as one batch, then each longer chunk. Writes, in order: every
    piece's final state into its request's slot, then the checkpoints (the singles' first)."""

    singles: mx.array | None  # [S] rows of one-token chunks; None: rows 0..S-1
    num_singles: int
    # The slots the singles start from, as stretches of consecutive slots (first single, first
    # slot, length); first slot -1: a stretch that starts its requests (zero state).
    single_reads: tuple[Stretch, ...]
    single_marked: tuple[int, ...]  # which singles (indices) leave a checkpoint
    chunks: tuple[tuple[int, int, StateChunk], ...]  # (first row, length, plan) of the others
    write_slots: tuple[int, ...]  # every slot written, in the order above
    # The writes as stretches of consecutive slots within one piece's states: (piece, first row
    # in it, first slot, length). Pieces: the singles, each chunk, the singles' checkpoints, each
    # chunk's checkpoint (those that are there).
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
        in_order = bool(single[:num_singles].all()) if num_singles else True
        singles = [p for p, one in zip(plans, single) if one]
        chunks = tuple(
            (int(first_rows[i]), int(lengths[i]), plans[int(i)]) for i in np.flatnonzero(~single)
        )
        pieces = [single_rows] + [np.arange(r, r + n) for r, n, _ in chunks]
        order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        marked = [i for i, p in enumerate(singles) if p.checkpoint >= 0]
        writes = [p.write for p in singles] + [p.write for _, _, p in chunks]
        writes += [singles[i].checkpoint for i in marked]
        writes += [p.checkpoint for _, _, p in chunks if p.checkpoint >= 0]
        sizes = [num_singles] if num_singles else []
        sizes += [1] * len(chunks) + ([len(marked)] if marked else [])
        sizes += [1 for _, _, p in chunks if p.checkpoint >= 0]
        return cls(
            singles=None if in_order else mx.array(single_rows.astype(np.int32)),
            num_singles=num_singles,
            single_reads=stretches([p.read for p in singles]),
            single_marked=tuple(marked),
            chunks=chunks,
            write_slots=tuple(writes),
            write_stretches=_piece_stretches(writes, sizes),
            restore=None if in_order else mx.array(np.argsort(order).astype(np.int32)),
            wire=wire,
        )


class PagedStateCache(SequenceRunner):
    """What a recurrent layer is handed during a packed forward in place of an ``ArraysCache``:
    the store layer whose slots hold its state, and the step's rows."""

    def __init__(self, store: StateStore, layer: int, rows: StateRows) -> None:
        self.store = store
        self.layer = layer
        self.rows = rows

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
            for start, stop in self._single_groups():
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
        for first, length, plan in rows.chunks:
            with gated_delta.prefill():  # long sequences chunked where mlx-lm has no kernel
                out, state, checkpoint = self._chunk(
                    call, x[first : first + length], plan, args, kwargs
                )
            outs.append(out)
            finals.append([(length, state)])
            if checkpoint is not None:
                checkpoints.append([(1, checkpoint)])
        self._write_back(finals + checkpoints)
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        return out if rows.restore is None else out[rows.restore]

    def _single_groups(self) -> list[tuple[int, int]]:
        """The one-token rows cut into groups whose state arrays stay under ``GROUP_BYTES``."""
        widest = max(
            int(np.prod(a.shape[1:])) * a.dtype.size for a in self.store.states[self.layer]
        )
        per, n = max(1, GROUP_BYTES // widest), self.rows.num_singles
        return [(start, min(start + per, n)) for start in range(0, n, per)]

    def _singles(
        self, call: LayerCall, x: mx.array, start: int, stop: int, args: tuple, kwargs: dict
    ) -> tuple[mx.array, list[mx.array]]:
        """One-token chunks ``start`` to ``stop - 1`` as a batch of length-1 sequences, each
        from its read slot (zeroed where the chunk starts its request)."""
        rows, cache = self.rows, _new_cache(len(self.store.states[self.layer]))
        picked = [
            self.store.read(self.layer, slot + lo - first if slot >= 0 else -1, hi - lo)
            for first, slot, n in rows.single_reads
            if (lo := max(first, start)) < (hi := min(first + n, stop))
        ]
        for e in range(len(picked[0])):
            parts = [p[e] for p in picked]
            cache[e] = parts[0] if len(parts) == 1 else mx.concatenate(parts)
        if rows.singles is not None:
            part = x[rows.singles[start:stop]]
        else:
            part = x if stop - start == x.shape[0] else x[start:stop]
        out = call(part, *args, **dict(kwargs, cache=cache))
        return out, list(cache.cache)

    def _chunk(
        self, call: LayerCall, rows: mx.array, plan: StateChunk, args: tuple, kwargs: dict
    ) -> tuple[mx.array, list[mx.array], list[mx.array] | None]:
        """One chunk as one sequence from its read slot (zeros when it starts its request), cut
        where it leaves a checkpoint; returns its output rows, final state and checkpoint."""
        cache = _new_cache(len(self.store.states[self.layer]))
        if plan.read >= 0:
            for e, state in enumerate(self.store.read(self.layer, plan.read, 1)):
                cache[e] = state
        length = rows.shape[0]
        cut = plan.checkpoint_at if 0 < plan.checkpoint_at < length else length
        outs, checkpoint = [], None
        for start, stop in ((0, cut), (cut, length)):
            if stop > start:
                piece = rows[start:stop].reshape(1, stop - start, -1)
                outs.append(
                    call(piece, *args, **dict(kwargs, cache=cache)).reshape(stop - start, 1, -1)
                )
            if plan.checkpoint >= 0 and stop == plan.checkpoint_at and checkpoint is None:
                checkpoint = list(cache.cache)
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        return out, list(cache.cache), checkpoint

    def _write_back(self, pieces: list[Piece]) -> None:
        """Every new state to its slot, per stretch of consecutive slots within a group: the
        store points them at the rows of this step's outputs (``StateStore.write``)."""
        for piece, first, slot, n in self.rows.write_stretches:
            for offset, state, lo, hi in _segments(pieces[piece], first, n):
                self.store.write(self.layer, slot + offset, state, lo, hi - lo)


LayerCall = Callable[..., mx.array]
# A piece's states as groups of rows: (rows, one array per state) each, in row order.
Piece = list[tuple[int, list[mx.array]]]
# The one-token rows of a step run in groups whose state arrays stay under this many bytes.
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


def _new_cache(size: int) -> Any:
    """An empty mlx-lm ``ArraysCache`` of ``size`` arrays, as the layer's own code expects."""
    from mlx_lm.models.cache import ArraysCache

    return ArraysCache(size)
