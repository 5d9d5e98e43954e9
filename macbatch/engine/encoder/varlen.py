"""Bidirectional attention over packed sequences (``cu_seqlens``): each sequence attends to all
of its own rows and to no other's, with no KV kept after the pass.

The linear layers run over the packed rows with no padding. Attention groups sequences of
similar length (each within 3/4 of its group's longest, the step's sequences sorted by length)
and runs one fused ``scaled_dot_product_attention`` per group over [B, H, L, D], the group's
short rows masked out as keys: a block-diagonal mask over the whole step would cost
(total tokens)^2, a call per sequence one launch per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

# (group index, its queries [B, H, L, D], its keys) -> [B or 1, H, L, L] added to the scores
ScoreBias = Callable[[int, mx.array, mx.array], mx.array]
# a group holds sequences at least this fraction of its longest (padding below 1/4 of the
# longest's length, in attention only)
_GROUP_FILL = 0.75


@dataclass(frozen=True)
class Group:
    gather: mx.array  # [B * L] packed row of each padded slot (pads: the group's first row)
    keys: mx.array  # [B, 1, 1, L] bool, True where the slot holds a real row
    valid: mx.array  # [n] slots of the padded group that hold real rows, in packed order
    lengths: mx.array  # [B, 1] float32, each member's length
    batch: int
    length: int

    def padded(self, x: mx.array) -> mx.array:
        """``x``'s packed rows [T, ...] as the group's [B, L, ...]."""
        return x[self.gather].reshape(self.batch, self.length, *x.shape[1:])


@dataclass(frozen=True)
class VarlenLayout:
    """Where each packed row sits in its group, built once per step with numpy."""

    groups: tuple[Group, ...]
    restore: mx.array  # [T] the packed order of the groups' concatenated real rows
    members: mx.array  # [S] each sequence's place among the groups' members, in group order

    @classmethod
    def build(cls, lengths: Sequence[int]) -> VarlenLayout:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        order = sorted(range(len(lengths)), key=lambda s: -lengths[s])
        groups, rows, members_all = [], [], []
        while order:
            longest = lengths[order[0]]
            count = 1
            while count < len(order) and lengths[order[count]] >= _GROUP_FILL * longest:
                count += 1
            members, order = order[:count], order[count:]
            members_all.extend(members)
            gather = np.full((count, longest), starts[members[0]], dtype=np.int32)
            keys = np.zeros((count, longest), dtype=bool)
            for b, s in enumerate(members):
                gather[b, : lengths[s]] = np.arange(starts[s], starts[s] + lengths[s])
                keys[b, : lengths[s]] = True
                rows.append(np.arange(starts[s], starts[s] + lengths[s]))
            groups.append(
                Group(
                    gather=mx.array(gather.reshape(-1)),
                    keys=mx.array(keys[:, None, None, :]),
                    valid=mx.array(np.flatnonzero(keys.reshape(-1)).astype(np.int32)),
                    lengths=mx.array(keys.sum(axis=1, keepdims=True).astype(np.float32)),
                    batch=count,
                    length=longest,
                )
            )
        concat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        restore = np.empty_like(concat)
        restore[concat] = np.arange(len(concat))
        places = np.empty(len(members_all), dtype=np.int32)
        places[members_all] = np.arange(len(members_all))
        return cls(
            groups=tuple(groups),
            restore=mx.array(restore.astype(np.int32)),
            members=mx.array(places),
        )


def varlen_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    layout: VarlenLayout,
    scale: float,
    window: int | None = None,
    score_bias: ScoreBias | None = None,
) -> mx.array:
    """``q``, ``k``, ``v``: [T, H, D] packed rows; the attention output as [T, H * D].
    ``window``: each row sees only the keys of its sequence at most that many positions away
    (ModernBERT's local layers; a group's slots are its members' positions). ``score_bias``:
    what is added to each group's scaled scores, from the group's index and its padded
    queries and keys (MPNet's and DeBERTa's relative positions)."""
    outputs = []
    for n, group in enumerate(layout.groups):
        q_, k_, v_ = (group.padded(x).transpose(0, 2, 1, 3) for x in (q, k, v))
        mask = group.keys
        if window is not None:
            slots = mx.arange(group.length)
            mask = mask & (mx.abs(slots[:, None] - slots[None, :]) <= window)
        if score_bias is not None:
            bias = score_bias(n, q_, k_).astype(q.dtype)
            mask = mx.where(mask, bias, mx.array(-mx.inf, q.dtype))
        out = mx.fast.scaled_dot_product_attention(q_, k_, v_, scale=scale, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(group.batch * group.length, -1)
        outputs.append(out[group.valid])
    return mx.concatenate(outputs, axis=0)[layout.restore]


def mean_rows(x: mx.array, layout: VarlenLayout) -> mx.array:
    """Each sequence's mean row of ``x`` [T, D], in float32, [S, D] in sequence order."""
    means = []
    for group in layout.groups:
        rows = group.padded(x.astype(mx.float32)) * group.keys.reshape(group.batch, -1, 1)
        means.append(rows.sum(axis=1) / group.lengths)
    return mx.concatenate(means, axis=0)[layout.members]
