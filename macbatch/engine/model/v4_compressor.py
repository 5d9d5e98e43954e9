"""DeepSeek V4's compressor as one op over a packed step: every group that closes in the step,
in every sequence, pooled by one gather and one softmax (docs/engine.md, "The compressor and
selection ops"), with the library module's own weights, norms and RoPE.

Two libraries' compressors, one rule (``v4_groups.py`` lays the groups out):

- mlx-lm's ``deepseek_v41`` (``Compressor`` of an ``Attention``): float32 projections
  ``kv_proj`` / ``gate_proj``, a row the softmax-gated sum of its group's, ``kv_norm``ed, roped
  by the attention's RoPE at its first token's position (``offset`` the group, ``scale`` the
  ratio) and rounded to fp4 (blocks of 16); its indexer's keys are ``k_norm(k_proj(row))`` of
  the unroped row, roped alike and rounded to fp4 (blocks of 32).
- mlx-vlm's ``deepseek_v4`` (``Compressor`` of a ``CompressedAttention``): ``wkv`` / ``wgate``
  with a learned per-offset bias ``ape`` on the gates, overlapping at ratio 4 (each row also
  pools its previous group, kept as DeepSeek's reference keeps it: ``model/overlap_pooling.py``),
  normed and roped by the compressor's own RoPE; its indexer's keys are pooled by a compressor of
  their own, over the same groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.deepseek_v41 import _apply_rope, _fake_quant_fp4

from macbatch.engine.model.v4_groups import GroupPlan, OpenGroups
from macbatch.metal import AttentionMetadata

# One ``OpenGroups`` per compressor of the layer: its rows', then its indexer's where pooled apart.
LayerState = tuple[OpenGroups, ...]


@dataclass(frozen=True)
class ClosedGroups:
    """The rows the step's closing groups make: what a cache writes, at row ``groups[i]`` of
    the step's sequence ``sequences[i]``."""

    rows: mx.array  # [G, head_dim] compressed rows, roped
    keys: mx.array | None  # [G, index_head_dim] the indexer's keys (None: the layer indexes not)
    sequences: mx.array  # [G] int32
    groups: mx.array  # [G] int32


def pool(
    plan: GroupPlan, kv: mx.array, gate: mx.array, state: OpenGroups, ape: mx.array | None
) -> tuple[mx.array, OpenGroups]:
    """The closing groups' pooled projections ``[G, width]`` (float32 softmax of the gates plus
    ``ape`` over each group, in the projections' dtype) from the step's projections ``kv, gate
    [N, W]`` and the carried ``state``, and the state after the step. Overlapping (``W`` twice
    the width): a group's own tokens on the second half of ``W``, its previous group's on the
    first."""
    kv_rows = plan.source(state.kv, kv, 0.0)
    gate_rows = plan.source(state.gate, gate, -float("inf"))
    bias = 0.0 if ape is None else ape
    own_kv, own_gate = kv_rows[plan.own], gate_rows[plan.own].astype(mx.float32) + bias
    if plan.previous is not None:
        half = kv.shape[-1] // 2
        before_gate = gate_rows[plan.previous].astype(mx.float32) + bias
        own_kv = mx.concatenate([kv_rows[plan.previous][..., :half], own_kv[..., half:]], axis=1)
        own_gate = mx.concatenate([before_gate[..., :half], own_gate[..., half:]], axis=1)
    weights = mx.softmax(own_gate, axis=1, precise=True).astype(own_kv.dtype)
    pooled = (own_kv * weights).sum(axis=1)
    return pooled, OpenGroups(kv_rows[plan.state], gate_rows[plan.state])


class V41Compressor:
    """A compressing layer of mlx-lm's ``deepseek_v41`` (its ``Attention``, a KV source), its
    indexer's keys made from its rows where it is an index source too."""

    def __init__(self, attention: Any) -> None:
        self.attention = attention
        self.compressor = attention.compressor
        self.ratio = int(self.compressor.ratio)
        indexer = getattr(attention, "indexer", None)
        self.indexer = indexer if hasattr(indexer, "k_proj") else None

    def plan(self, meta: AttentionMetadata) -> GroupPlan:
        """The step's groups for this layer's ratio (shared by every layer of that ratio)."""
        return GroupPlan.build(meta, self.ratio, overlap=False)

    def empty(self, sequences: int) -> LayerState:
        """The state of sequences none of whose tokens has been seen (float32, as mlx-lm's
        ``pending_kv``; a ratio-1 compressor keeps none it reads)."""
        width = self.compressor.kv_proj.weight.shape[0]
        return (OpenGroups.empty(sequences, self.ratio, width, mx.float32),)

    def compress(
        self, x: mx.array, plan: GroupPlan, state: LayerState
    ) -> tuple[ClosedGroups, LayerState]:
        """The closing groups of the step's rows ``x [N, hidden]``, and the state after."""
        if self.ratio == 1:  # mlx-lm projects in the input's dtype, with no gate
            kv = self.compressor.kv_proj(x)
            gate = mx.zeros_like(kv)
        else:
            h = x.astype(mx.float32)
            kv, gate = self.compressor.kv_proj(h), self.compressor.gate_proj(h)
        pooled, after = pool(plan, kv, gate, state[0], None)
        latent = self.compressor.kv_norm(pooled.astype(x.dtype))
        rows = self._place(latent, plan, block_size=16, e4m3_scale=True)
        keys = None
        if self.indexer is not None:
            projected = self.indexer.k_norm(self.indexer.k_proj(latent))
            keys = self._place(projected, plan, block_size=32, e4m3_scale=False)
        return ClosedGroups(rows, keys, plan.sequences, plan.groups), (after,)

    def _place(
        self, rows: mx.array, plan: GroupPlan, block_size: int, e4m3_scale: bool
    ) -> mx.array:
        """``rows [G, D]`` roped at their groups' first tokens and rounded to fp4, as
        ``Attention._compress`` does (none when no group closes: mlx-lm's rounding takes no
        empty array)."""
        if plan.closing == 0:
            return rows
        rope_dim = int(self.attention.rope_dim)
        # mlx-lm types ``offset`` an int; ``mx.fast.rope`` takes one per batch entry (group)
        groups: Any = plan.groups
        roped = _apply_rope(
            rows[:, None], self.attention.rope, rope_dim=rope_dim, offset=groups, scale=self.ratio
        )
        return _fake_quant_fp4(roped[:, 0], block_size=block_size, e4m3_scale=e4m3_scale)


class _VlmPooling:
    """One of mlx-vlm's ``deepseek_v4`` ``Compressor`` modules: the attention's or its
    indexer's."""

    def __init__(self, compressor: Any) -> None:
        self.compressor = compressor

    def empty(self, sequences: int, keep: int, dtype: mx.Dtype) -> OpenGroups:
        return OpenGroups.empty(sequences, keep, int(self.compressor.out_dim), dtype)

    def compress(
        self, x: mx.array, plan: GroupPlan, state: OpenGroups
    ) -> tuple[mx.array, OpenGroups]:
        """The closing groups' rows ``[G, head_dim]``, normed and roped, and the state after."""
        c = self.compressor
        pooled, after = pool(plan, c.wkv(x), c.wgate(x), state, c.ape)
        positions = plan.groups * plan.ratio  # the group's first token: the RoPE divides it
        rows = c.rope(c.norm(pooled)[:, None, None], offset=positions)
        return rows[:, 0, 0], after


class V4Compressor:
    """A compressing layer of mlx-vlm's ``deepseek_v4`` (``CompressedAttention``): its rows'
    compressor and, on a CSA layer (``SparseCompressedAttention``), its indexer's."""

    def __init__(self, attention: Any) -> None:
        self.rows = _VlmPooling(attention.compressor)
        indexer = getattr(attention, "indexer", None)
        self.keys = None if indexer is None else _VlmPooling(indexer.compressor)
        self.ratio = int(attention.compressor.compress_ratio)
        self.overlap = bool(attention.compressor.overlap)

    def plan(self, meta: AttentionMetadata) -> GroupPlan:
        """The step's groups for this layer's ratio (shared by every layer of that ratio)."""
        return GroupPlan.build(meta, self.ratio, overlap=self.overlap)

    def empty(self, sequences: int, dtype: mx.Dtype = mx.float32) -> LayerState:
        """The state of sequences none of whose tokens has been seen, in the model's dtype (as
        mlx-vlm's ``PoolingCache`` keeps its projections)."""
        keep = (2 if self.overlap else 1) * self.ratio
        poolings = [self.rows] if self.keys is None else [self.rows, self.keys]
        return tuple(p.empty(sequences, keep, dtype) for p in poolings)

    def compress(
        self, x: mx.array, plan: GroupPlan, state: LayerState
    ) -> tuple[ClosedGroups, LayerState]:
        """The closing groups of the step's rows ``x [N, hidden]``, and the state after."""
        rows, after = self.rows.compress(x, plan, state[0])
        if self.keys is None:
            return ClosedGroups(rows, None, plan.sequences, plan.groups), (after,)
        keys, keys_after = self.keys.compress(x, plan, state[1])
        return ClosedGroups(rows, keys, plan.sequences, plan.groups), (after, keys_after)


def layer_compressor(attention: Any) -> V41Compressor | V4Compressor:
    """The op for a compressing attention module of either library (mlx-lm's projects with
    ``kv_proj``, mlx-vlm's with ``wkv``)."""
    if hasattr(attention.compressor, "kv_proj"):
        return V41Compressor(attention)
    return V4Compressor(attention)
