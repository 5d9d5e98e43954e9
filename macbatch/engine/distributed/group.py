"""The process group a launcher started: who is rank 0, and agreeing on numbers across ranks."""

from __future__ import annotations

from typing import cast

import mlx.core as mx

from macbatch.engine.distributed.watchdog import guarded, timeout_from_env

# Connecting may take a few step deadlines: the ranks on other hosts start over ssh.
CONNECT_TIMEOUTS = 3

_group: mx.distributed.Group | None = None


def join() -> mx.distributed.Group | None:
    """Connect to the other ranks (once per process; only in a process a launcher started, which
    ``macbatch.commands.launch.launched`` tells); None when the launcher started this rank alone."""
    global _group
    if _group is None:
        # MLX waits forever for a rank that never connects (a host down, a wrong address).
        with guarded(CONNECT_TIMEOUTS * timeout_from_env(), "connecting to the other ranks"):
            group = mx.distributed.init(strict=True)
        if group.size() > 1:
            _group = group
    return _group


def current() -> mx.distributed.Group | None:
    """The group ``join`` connected to, if any."""
    return _group


def leave() -> None:
    """Stop sharing models with the group (it stays connected): every rank of whole-model
    replicas loads the whole model alone, and the ranks talk through ``exchange.py`` only."""
    global _group
    _group = None


def smallest(value: int, group: mx.distributed.Group) -> int:
    """The smallest of every rank's ``value`` (every rank must call this at the same point)."""
    mine = mx.array([value], dtype=mx.int32)
    return _ints(mx.distributed.all_min(mine, group=group, stream=mx.cpu))[0]


def rank_zero_value(value: int, group: mx.distributed.Group) -> int:
    """Rank 0's ``value`` on every rank (the others' are unread; every rank must call this at
    the same point)."""
    mine = mx.array([value if group.rank() == 0 else 0], dtype=mx.int32)
    return _ints(mx.distributed.all_sum(mine, group=group, stream=mx.cpu))[0]


def failed_ranks(failed: bool, group: mx.distributed.Group) -> list[int]:
    """Every rank says whether it failed; all of them learn which did."""
    flags = mx.distributed.all_gather(
        mx.array([int(failed)], dtype=mx.int32), group=group, stream=mx.cpu
    )
    return [rank for rank, flag in enumerate(_ints(flags)) if flag]


def _ints(array: mx.array) -> list[int]:
    """A 1-d integer array's values (MLX's stub types ``tolist`` as any nesting of scalars)."""
    return cast(list[int], array.tolist())
