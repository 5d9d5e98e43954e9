"""Splits a model's weights across the ranks with mlx-lm's own ``Model.shard(group)``.

Attention heads and MLP columns are split evenly (q/k/v and gate/up "all-to-sharded", o and down
"sharded-to-all", each of those an ``all_sum``), so every rank keeps ``1 / size`` of the KV heads
and its own KV pool holds only those. Embeddings, norms and the LM head stay whole on every rank.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.adapter import UnsupportedModelError, unsupported_reason


@cache
def sharded_architectures() -> tuple[str, ...]:
    """mlx-lm model types that can be split (their module defines ``shard``) and that macbatch
    serves."""
    import mlx_lm.models

    folder = Path(mlx_lm.models.__file__).parent
    return tuple(
        sorted(
            path.stem
            for path in folder.glob("*.py")
            if "def shard(" in path.read_text() and unsupported_reason(path.stem) is None
        )
    )


def shard_model(model: nn.Module, group: mx.distributed.Group) -> None:
    """Keep this rank's share of ``model``'s weights (in place), or say why it cannot be split."""
    size = group.size()
    args = getattr(model, "args", None)
    model_type = getattr(args, "model_type", type(model).__module__.rsplit(".", 1)[-1])
    if not callable(getattr(model, "shard", None)):
        raise UnsupportedModelError(
            f"model type '{model_type}' cannot be split across {size} ranks: mlx-lm has no "
            f"tensor-parallel sharding for it. Architectures that have it: "
            f"{', '.join(sharded_architectures())}"
        )
    for field in ("num_attention_heads", "num_key_value_heads"):
        count = getattr(args, field, None)
        if isinstance(count, int) and count % size:
            raise UnsupportedModelError(
                f"model type '{model_type}' has {count} {field.replace('_', ' ')[4:]}, which "
                f"{size} ranks cannot split evenly; launch a number of ranks that divides {count}"
            )
    model.shard(group)
    mx.eval(model.parameters())
