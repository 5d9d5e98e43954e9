"""Loading one model on every rank at once, so that a rank that cannot load it stops the group
with a clear error instead of leaving the others waiting in a collective."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from macbatch.engine.config import EngineConfig
from macbatch.engine.distributed.channel import LoadOrder, channel_of
from macbatch.engine.distributed.group import failed_ranks
from macbatch.engine.loader import load_model


def load_on_every_rank(
    name: str, config: EngineConfig, group: mx.distributed.Group
) -> tuple[Any, Any]:
    """``load_model`` on this rank, lazily (each rank materializes only its shard later); rank 0
    first tells the others what to load."""
    if group.rank() == 0:
        channel_of(group).send_load(LoadOrder(name, config))
    try:
        loaded = load_model(name, lazy=True)
    except Exception:
        failed_ranks(True, group)
        raise
    failed = failed_ranks(False, group)
    if failed:
        raise ValueError(
            f"rank(s) {', '.join(map(str, failed))} could not load model '{name}' (their error "
            "is in their output); every rank needs the model at the same path or hub id"
        )
    return loaded
