"""What the model runner needs of the ranks that share its model, as protocols: the runner
declares them and ``distributed/ranks.py`` provides them (``TensorRanks``), so the worker imports
nothing of ``distributed/``, whose follower runs a runner (docs/distributed.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

    from macbatch.engine.model.batch import PackedBatch


class Followers(Protocol):
    """Rank 0's channel to the other ranks: each step sent before its forward, its end, the
    stop."""

    def send_step(self, batch: PackedBatch) -> None: ...

    def step_finished(self) -> None: ...

    def send_stop(self) -> None: ...


class Ranks(Protocol):
    """A tensor-parallel group: each rank keeps its shard of the model and pages its own KV
    heads, and the ranks agree on the smallest pool."""

    @property
    def group(self) -> mx.distributed.Group: ...

    def shard(self, model: nn.Module) -> None:
        """Keep this rank's shard of ``model``'s layers."""
        ...

    def smallest(self, value: int) -> int:
        """The smallest of every rank's ``value`` (a collective: every rank calls it at the same
        point)."""
        ...

    def followers(self) -> Followers | None:
        """Rank 0's channel to the others (None on the others)."""
        ...
