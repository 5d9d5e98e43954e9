"""Loading a model for the engine: alone, or on every rank of a launched group at once, so that
a rank that cannot load it stops the group with a clear error instead of leaving the others
waiting in a collective."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from macbatch.engine.config import EngineConfig
from macbatch.engine.distributed.channel import LoadOrder, channel_of
from macbatch.engine.distributed.group import current, failed_ranks, rank_zero_value
from macbatch.engine.loader import declared_head_dim, load_model
from macbatch.engine.speculative.methods import SPECULATIVE_MODES
from macbatch.engine.stores.pages import PageFormat

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load(
    name: str, config: EngineConfig
) -> tuple[nn.Module, TokenizerWrapper, mx.distributed.Group | None]:
    """The model and tokenizer ``name`` names, and the group that shares them (None alone):
    every rank of a launched group loads it lazily (each materializes only its shard)."""
    head_dim = declared_head_dim(name) if config.kv_bits else None
    if head_dim is not None:  # a group size that cannot work fails before the weights load
        PageFormat(mx.float16, config.kv_bits, config.kv_group_size).group_size_for(head_dim)
    group = current()
    if group is None:
        model, tokenizer = load_model(name)
    else:
        model, tokenizer = load_on_every_rank(name, config, group)
    return model, tokenizer, group


def load_on_every_rank(
    name: str, config: EngineConfig, group: mx.distributed.Group
) -> tuple[nn.Module, TokenizerWrapper]:
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


def settle_drafting(mode: str | None, group: mx.distributed.Group | None) -> str | None:
    """Rank 0's speculative mode as it resolved it once its drafter (a draft model or an MTP
    layer: rank 0's alone, loaded after the model) loaded, on every rank of ``group``; None when
    it could not load one (rank 0 says why). Every rank calls this between loading the model and
    building its runner (the others' ``mode`` is unread), so a drafter that fails stops the
    followers at once instead of leaving them in the runner's first collective, and they build
    their runner for the mode rank 0 runs (``auto`` without MTP heads is "off": no snapshot
    state slots). Alone (no group): ``mode``."""
    if group is None:
        return mode
    code = 0 if mode is None else SPECULATIVE_MODES.index(mode) + 1
    settled = rank_zero_value(code, group)
    return None if settled == 0 else SPECULATIVE_MODES[settled - 1]
