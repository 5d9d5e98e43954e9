"""The disk tier's default byte cap, decided here once (MLX-free: the front ends say it at start
and `macbatch cache` shows it). A laptop's disk is shared with everything else and a small
model's prefixes are small, so the cap follows the model: twice its weights, never under a floor
that holds a useful prefix cache for the smallest model, never over 20 GiB nor a tenth of the
disk's free space (the demo model's 3.4 MiB once let the cache grow to 1.1 GiB)."""

from __future__ import annotations

import shutil
from pathlib import Path

MAX_CAP_BYTES = 20 * 2**30
MIN_CAP_BYTES = 256 * 2**20
WEIGHTS_MULTIPLE = 2
FREE_FRACTION = 10  # at most 1/FREE_FRACTION of the free space


def ceiling_bytes(directory: Path) -> int:
    """20 GiB or a tenth of the free space of the disk ``directory`` is (or will be) on."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return MAX_CAP_BYTES
    return min(MAX_CAP_BYTES, free // FREE_FRACTION)


def default_cap_bytes(directory: Path, weights_bytes: int | None) -> int:
    """Twice the weights (at least 256 MiB), under ``ceiling_bytes``; weights not known (a hub
    model not downloaded yet): the ceiling."""
    ceiling = ceiling_bytes(directory)
    if weights_bytes is None:
        return ceiling
    return min(ceiling, max(MIN_CAP_BYTES, WEIGHTS_MULTIPLE * weights_bytes))


def cap_rule(directory: Path) -> str:
    """The default cap's rule in words, with this disk's ceiling (``macbatch cache``)."""
    return (
        f"{WEIGHTS_MULTIPLE} x the model's weights, at least {MIN_CAP_BYTES / 2**20:,.0f} MiB, "
        f"at most {ceiling_bytes(directory) / 2**20:,.1f} MiB here ({MAX_CAP_BYTES // 2**30} GiB "
        f"or 1/{FREE_FRACTION} of the free space)"
    )
