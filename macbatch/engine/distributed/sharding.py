"""Splits a model's weights across the ranks with mlx-lm's own ``Model.shard(group)``.

Attention heads, a hybrid model's recurrent heads (Qwen3.5's Gated DeltaNet: its q/k/v/z/a/b
projections and convolution channels by head, each rank keeping its heads' share of every state
slot) and MLP columns are split evenly (q/k/v and gate/up "all-to-sharded", o and down
"sharded-to-all", each of those an ``all_sum``), so every rank keeps ``1 / size`` of the KV heads
and its own KV pool holds only those. Embeddings and norms stay whole on every rank, and the LM
head too except where mlx-lm splits it by vocabulary (Qwen3.5 with untied embeddings: then every
rank applies it, ``ModelAdapter.head_is_split``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.model.adapter import UnsupportedModelError, text_model
from macbatch.engine.model.families import unsupported_reason

_HEAD_COUNTS = (
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",  # a Gated DeltaNet's
    "linear_num_value_heads",
)


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
    text_args = getattr(text_model(model), "args", args)  # a multimodal wrapper's text model's
    for field in _HEAD_COUNTS:
        count = getattr(text_args, field, None)
        if isinstance(count, int) and count % size:
            raise UnsupportedModelError(
                f"model type '{model_type}' has {count} {_words(field)}, which "
                f"{size} ranks cannot split evenly; launch a number of ranks that divides {count}"
            )
    model.shard(group)
    mx.eval(model.parameters())


def _words(field: str) -> str:
    """``num_key_value_heads`` -> "key value heads"; ``linear_num_value_heads`` -> "linear value
    heads"."""
    return field.replace("num_", "").replace("_", " ")
