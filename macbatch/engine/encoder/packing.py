"""Which inputs share a forward: sorted by length (longest first), each pass filled up to a
token budget, so passes stay full and each attention group's lengths stay close."""

from __future__ import annotations

from collections.abc import Sequence


def passes(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Input indices per pass; an input longer than ``budget`` runs alone."""
    out: list[list[int]] = []
    used = budget
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if used + lengths[index] > budget:
            out.append([])
            used = 0
        out[-1].append(index)
        used += lengths[index]
    return out
