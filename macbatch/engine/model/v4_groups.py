"""Where DeepSeek V4's compressor groups sit in a packed step: which groups close, the token
projections each pools, and each sequence's open-group state after the step, as gather indices
made once per step with numpy (no loop over rows or sequences), so that one gather and one
softmax pool every closing group of every sequence (``v4_compressor.py``).

A compressor of ratio ``m`` pools the projections of the tokens of group ``g``, positions
``g m`` to ``g m + m - 1``, into row ``g`` once its last token is seen (``(p + 1) % m == 0``).
The projections of a group not yet closed cannot be recomputed from anything a cache keeps, so
each sequence carries them from step to step: its ``OpenGroups`` slot, ``keep`` projections
from position ``base = (start // m - back) m``, where ``back`` is 1 for an overlapping
compressor (DeepSeek V4's ratio 4: a row also pools its previous group's tokens, on the other
half of a doubled projection, as DeepSeek's reference keeps them in ``kv_state``; the first
group's previous one is zeros with gates of -inf) and 0 otherwise. Slots for positions outside
the sequence hold zeros and are never pooled.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from macbatch.metal import AttentionMetadata


@dataclass(frozen=True)
class OpenGroups:
    """Each sequence's carried projections ``kv [S, keep, width]`` and ``gate`` (the slots of
    positions ``base`` on, zeros where none)."""

    kv: mx.array
    gate: mx.array

    @classmethod
    def empty(cls, sequences: int, keep: int, width: int, dtype: mx.Dtype) -> OpenGroups:
        """The state of sequences none of whose tokens has been seen."""
        zeros = mx.zeros((sequences, keep, width), dtype=dtype)
        return cls(zeros, zeros)


@dataclass(frozen=True)
class GroupPlan:
    """One step's closing groups of one ratio, as indices into the source rows that
    ``source`` builds: the carried slots (``S * keep``), the step's rows (``N``), then a row of
    zeros (``zero``) and one whose gate is -inf (``none``: the first group's previous one)."""

    ratio: int
    keep: int  # slots carried per sequence: m, or 2m when overlapping
    own: mx.array  # [G, m] int32: the tokens of each closing group
    previous: mx.array | None  # [G, m] int32: those of its previous group, when overlapping
    sequences: mx.array  # [G] int32: each closing group's sequence in the step
    groups: mx.array  # [G] int32: its index among its sequence's groups (the row it becomes)
    state: mx.array  # [S, keep] int32: each sequence's slots after the step
    host_groups: np.ndarray  # ``groups`` as numpy

    @classmethod
    def build(cls, meta: AttentionMetadata, ratio: int, overlap: bool) -> GroupPlan:
        """The plan of the step's sequences (``meta``'s host copies) for ratio ``ratio``."""
        cu = meta.host_cu_seqlens_q.astype(np.int64)
        end = meta.host_seq_lens.astype(np.int64)
        start = end - (cu[1:] - cu[:-1])
        back = 1 if overlap else 0
        keep = (1 + back) * ratio
        where = _Where(cu, start, (start // ratio - back) * ratio, keep)
        counts = end // ratio - start // ratio
        sequences = np.repeat(np.arange(len(end)), counts)
        firsts = np.repeat(np.cumsum(counts) - counts, counts)
        groups = start[sequences] // ratio + np.arange(len(sequences)) - firsts
        tokens = groups[:, None] * ratio + np.arange(ratio)  # [G, m] positions
        previous = where.rows(sequences, tokens - ratio) if overlap else None
        slots = (end // ratio - back)[:, None] * ratio + np.arange(keep)  # [S, keep] positions
        state = where.rows(np.arange(len(end)), slots)
        state = np.where((slots < 0) | (slots >= end[:, None]), where.zero, state)
        return cls(
            ratio,
            keep,
            _int32(where.rows(sequences, tokens)),
            None if previous is None else _int32(previous),
            _int32(sequences),
            _int32(groups),
            _int32(state),
            groups.astype(np.int32),
        )

    @property
    def closing(self) -> int:
        """How many groups close in this step."""
        return len(self.host_groups)

    def source(self, carried: mx.array, new: mx.array, none: float) -> mx.array:
        """The rows the plan's indices point into: ``carried [S, keep, W]``, ``new [N, W]``,
        zeros, then ``none`` (0 for projections, -inf for gates)."""
        width = new.shape[-1]
        flat = carried.astype(new.dtype).reshape(-1, width)
        zero = mx.zeros((1, width), dtype=new.dtype)
        return mx.concatenate([flat, new, zero, mx.full((1, width), none, dtype=new.dtype)])


class _Where:
    """Where the projection of a token of a sequence lies among the source rows."""

    def __init__(self, cu: np.ndarray, start: np.ndarray, base: np.ndarray, keep: int) -> None:
        self.cu, self.start, self.base, self.keep = cu, start, base, keep
        self.carried = len(start) * keep
        self.zero = self.carried + int(cu[-1])

    def rows(self, sequences: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The source row of each of ``positions [G, k]`` (row ``i`` of sequence
        ``sequences[i]``): the step's row, the carried slot, or the ``none`` row before the
        first token."""
        seq = sequences[:, None]
        start = self.start[seq]
        stepped = self.carried + self.cu[seq] + positions - start
        slot = seq * self.keep + positions - self.base[seq]
        rows = np.where(positions >= start, stepped, slot)
        return np.where(positions < 0, self.zero + 1, rows)


def _int32(values: np.ndarray) -> mx.array:
    return mx.array(np.ascontiguousarray(values, dtype=np.int32))
