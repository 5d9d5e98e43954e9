"""Packed steps of several DeepSeek V4 sequences, for the compressor and selection ops
(``engine/model/v4_compressor.py``, ``v4_selection.py``): staggered chunks, each sequence
joining a step later than the one before and cut where the others are not, and the op run over
them step by step with each sequence's open-group state carried as a cache would carry it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from macbatch.engine.model.v4_compressor import LayerState, V4Compressor, V41Compressor
from macbatch.engine.model.v4_groups import OpenGroups
from macbatch.metal import AttentionMetadata


@dataclass(frozen=True)
class Chunk:
    """Rows ``start:end`` of sequence ``sequence`` in one step."""

    sequence: int
    start: int
    end: int


def staggered(lengths: Sequence[int], sizes: Sequence[Sequence[int]]) -> list[list[Chunk]]:
    """The steps of sequences of ``lengths``: sequence ``i`` joins at step ``i`` and takes
    chunks of its ``sizes`` in turn (cycled) until it is whole."""
    done = [0] * len(lengths)
    turn = [0] * len(lengths)
    steps: list[list[Chunk]] = []
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        step = []
        for i, n in enumerate(lengths):
            if i > len(steps) or done[i] >= n:
                continue
            size = sizes[i][turn[i] % len(sizes[i])]
            end = min(n, done[i] + size)
            step.append(Chunk(i, done[i], end))
            done[i], turn[i] = end, turn[i] + 1
        steps.append(step)
    return steps


def step_meta(chunks: list[Chunk]) -> AttentionMetadata:
    """The step's ``AttentionMetadata`` (no pages: the ops read none)."""
    cu = np.cumsum([0, *(c.end - c.start for c in chunks)]).astype(np.int32)
    ends = np.array([c.end for c in chunks], dtype=np.int32)
    return AttentionMetadata.build(np.zeros((len(chunks), 1), np.int32), ends, cu)


def step_rows(chunks: list[Chunk], per_sequence: Sequence[mx.array]) -> mx.array:
    """The step's packed rows of ``per_sequence`` arrays ``[T_i, ...]``."""
    return mx.concatenate([per_sequence[c.sequence][c.start : c.end] for c in chunks])


def positions(chunks: list[Chunk]) -> mx.array:
    """Each packed row's position in its sequence."""
    return mx.array(np.concatenate([np.arange(c.start, c.end) for c in chunks]).astype(np.int32))


@dataclass
class Compressed:
    """What the op made over every step: each sequence's rows and keys, in group order, and
    its state after its last step."""

    rows: list[mx.array]
    keys: list[mx.array | None]
    state: list[LayerState]


def run_compressor(
    op: V41Compressor | V4Compressor, x: Sequence[mx.array], steps: list[list[Chunk]]
) -> Compressed:
    """The op over ``steps`` of hidden states ``x[i] [T_i, hidden]``, each step's sequences'
    states stacked from the last step each took part in and split back after."""
    count = len(x)
    states: list[LayerState] = [
        tuple(OpenGroups(s.kv[0], s.gate[0]) for s in op.empty(1)) for _ in range(count)
    ]
    rows: list[list[mx.array]] = [[] for _ in range(count)]
    keys: list[list[mx.array]] = [[] for _ in range(count)]
    for chunks in steps:
        meta = step_meta(chunks)
        plan = op.plan(meta)
        parts = zip(*(states[c.sequence] for c in chunks), strict=True)
        state = tuple(
            OpenGroups(mx.stack([p.kv for p in ps]), mx.stack([p.gate for p in ps])) for ps in parts
        )
        closed, after = op.compress(step_rows(chunks, x), plan, state)
        for s, chunk in enumerate(chunks):
            states[chunk.sequence] = tuple(OpenGroups(a.kv[s], a.gate[s]) for a in after)
        owners = np.asarray(closed.sequences)
        assert np.array_equal(np.asarray(closed.groups), plan.host_groups)
        for g, s in enumerate(owners):
            sequence = chunks[int(s)].sequence
            assert int(plan.host_groups[g]) == len(rows[sequence])  # rows come in group order
            rows[sequence].append(closed.rows[g])
            if closed.keys is not None:
                keys[sequence].append(closed.keys[g])
    return Compressed(
        [mx.stack(r) if r else mx.zeros((0, 1)) for r in rows],
        [mx.stack(k) if k else None for k in keys],
        states,
    )


def gaps(a: mx.array, b: mx.array) -> float:
    """The largest absolute difference, in float64."""
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(initial=0.0))
