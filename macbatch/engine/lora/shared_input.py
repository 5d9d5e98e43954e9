"""The first half of a step's low-rank products, ``x A``, as dense matmuls, one per group of
adapted projections that read the same input (q/k/v; gate/up; any other alone).

A step's rows carry several adapters. ``mx.gather_mm`` with one index per row runs one small
matmul per row on MLX's CPU, a cost per row and per projection that grew to 70% of a prefill
step's base layers (docs/models.md, "Fine-tunes"). Here every row meets the A of every adapter
in the step at once (``x @ [A_1 | A_2 | ...]``, one BLAS call over all rows), and each row's
columns of the other adapters are zeroed by the step's selector; a projection's ``B`` stack,
flattened the same way, then sums only its row's adapter. What more this multiplies (the other
adapters' columns) is rank x adapters, small beside the base layer; the step names the adapters
it holds (``StepAdapters.present``), so adapters loaded but not in the step cost nothing.
The projections of a group share one product: mlx-lm's modules pass the same input array to
each (``self.q_proj(x), self.k_proj(x), self.v_proj(x)``), which is checked by identity, so a
model that does not simply computes each member's own."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

# Projections that read their module's one input, by the names mlx-lm's models give them.
GROUPS = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("q_a_proj", "kv_a_proj_with_mqa"),  # MLA's down-projections
)


def group_key(path: str, dims_in: int) -> str:
    """The group of a linear layer (its path, its input features): its siblings of the same
    ``GROUPS`` entry and width (a projection in no entry is a group alone)."""
    parent, _, leaf = path.rpartition(".")
    group = next((g for g in GROUPS if leaf in g), (leaf,))
    return f"{parent}.{'+'.join(group)}:{dims_in}"


class StepAdapters:
    """What the adapted layers read of the step being built, set by ``AdapterBank.use`` before
    each forward: each row's slot (``rows``, ``[N]`` uint32; None: every row is the base
    model's), which of the stacks' adapter columns (slot - 1) the step holds (``present``;
    None: all of them) and each row's one-hot over those (``selector``). ``expert_slots``:
    inside an MoE block, the slot of each of its expert indices (as given, and as mlx-lm's
    ``SwitchGLU`` / ``SwitchMLP`` sort them), set by ``PackedExperts``."""

    def __init__(self) -> None:
        self.rows: mx.array | None = None
        self.present: mx.array | None = None
        self.selector: mx.array | None = None  # [N, 1, 1, k, 1] bool
        self.expert_slots: tuple[mx.array, mx.array] | None = None
        self.number = 0  # counts the steps, so a product is never reused across two

    def use(self, rows: mx.array | None, columns: int) -> None:
        """The next forward's rows (``columns``: the adapter slots the stacks hold, 1..)."""
        self.number += 1
        self.rows, self.present, self.selector = rows, None, None
        if rows is None:
            return
        slots = np.asarray(rows)  # built from host lists: no device wait
        held = np.unique(slots[slots > 0])
        if len(held) < columns:
            self.present = mx.array(held - 1, mx.uint32)
        else:
            held = np.arange(1, columns + 1)
        self.selector = mx.array((slots[:, None] == held[None, :])[:, None, None, :, None])


class SharedInput:
    """One group's ``A`` for every member and adapter, ``[in, m, C, r]`` (``C`` adapter columns,
    slot - 1; ranks padded to the group's largest with zeros), and the masked product of the
    input the group was last handed, kept until each member took its part."""

    def __init__(self, step: StepAdapters) -> None:
        self.step = step
        self.lora_a: mx.array | None = None
        self._x: mx.array | None = None
        self._z: mx.array | None = None
        self._number = -1
        self._left = 0

    def product(self, x: mx.array, member: int) -> mx.array:
        """``x``'s rows times their own adapter's ``A`` of member ``member``: ``[N, M, k * r]``
        (``M`` inputs per row), the columns of other adapters zero."""
        assert self.lora_a is not None
        members = self.lora_a.shape[1]
        if x is not self._x or self._number != self.step.number:
            self._x, self._z, self._number = x, self._masked(x), self.step.number
            self._left = members
        z = self._z
        assert z is not None
        self._left -= 1
        if self._left == 0:  # every member has its part: the product's memory goes
            self._x = self._z = None
        width = z.shape[-1] // members
        return z[..., member * width : (member + 1) * width]

    def _masked(self, x: mx.array) -> mx.array:
        step = self.step
        assert self.lora_a is not None and step.rows is not None and step.selector is not None
        a = self.lora_a if step.present is None else mx.take(self.lora_a, step.present, axis=2)
        dims_in, members, columns, rank = a.shape
        n = step.rows.shape[0]
        z = x.reshape(n, -1, dims_in) @ a.reshape(dims_in, -1)  # [N, M, m * k * r]
        z = z.reshape(n, -1, members, columns, rank) * step.selector
        return z.reshape(n, -1, members * columns * rank)
