"""A launched group as the model runner sees it (``worker/ranks.py``'s ``Ranks``): its shard of
the model, the smallest pool, and rank 0's channel to the followers."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.distributed.channel import StepChannel, channel_of
from macbatch.engine.distributed.group import smallest
from macbatch.engine.distributed.sharding import shard_model


@dataclass(frozen=True)
class TensorRanks:
    """The ranks of ``group`` splitting one model (tensor parallelism, ``sharding.py``)."""

    group: mx.distributed.Group

    def shard(self, model: nn.Module) -> None:
        shard_model(model, self.group)

    def smallest(self, value: int) -> int:
        return smallest(value, self.group)

    def followers(self) -> StepChannel | None:
        return channel_of(self.group) if self.group.rank() == 0 else None


def ranks_of(group: mx.distributed.Group | None) -> TensorRanks | None:
    """The runner's view of ``group`` (None: one process)."""
    return None if group is None else TensorRanks(group)
