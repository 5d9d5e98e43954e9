"""Starting under a distributed launcher (``mlx.launch``): every rank joins the group before any
command runs; rank 0 goes on to run the command, every other rank follows rank 0's engine.

Light on purpose: the CLI checks ``launched()`` on every start, before anything imports MLX.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from macbatch.engine.distributed.channel import LoadOrder

# mlx.launch sets MLX_RANK for the ring and JACCL backends; mpirun sets OMPI_COMM_WORLD_RANK.
RANK_VARIABLES = ("MLX_RANK", "OMPI_COMM_WORLD_RANK")


def launched() -> bool:
    """True when a distributed launcher started this process with other ranks to join."""
    if not any(os.environ.get(name) for name in RANK_VARIABLES):
        return False
    # `mlx.launch` with a single host gives the ring backend an empty hostfile: no group.
    hostfile = os.environ.get("MLX_HOSTFILE")
    return (
        hostfile is None or not Path(hostfile).is_file() or bool(Path(hostfile).read_text().strip())
    )


class LaunchError(RuntimeError):
    """A rank variable is set but no group can be joined: what is set, and what to do."""


def _not_launched(reason: str) -> str:
    named = ", ".join(f"{name}={os.environ[name]}" for name in RANK_VARIABLES if name in os.environ)
    return (
        f"{named} says a distributed launcher started this process, but MLX cannot join its "
        f"group ({reason}); unset {' and '.join(RANK_VARIABLES)} to run on this machine alone, "
        "or start the command with mlx.launch (docs/distributed.md)"
    )


def follower_exit_status() -> int | None:
    """Join the group if launched; on ranks other than 0, follow rank 0 until it stops and return
    the exit status. None on rank 0 and outside a launcher: go on with the command."""
    if not launched():
        return None
    # The one front-end import of engine modules (tests/test_import_graph.py allows it): joining
    # the group and following rank 0 are the engine's own distributed layer, run before any
    # command, on ranks that never build an Engine (docs/distributed.md).
    from macbatch.engine.distributed.group import join

    try:
        group = join()
    except RuntimeError as error:  # MLX: "Couldn't initialize any backend"
        raise LaunchError(_not_launched(str(error))) from None
    if group is None:
        return None
    from macbatch.engine.distributed.channel import channel_of

    if group.rank() == 0:
        channel_of(group)  # from now on, rank 0 releases the followers when it exits
        return None
    from macbatch.engine.distributed.follower import follow

    def replicate(order: LoadOrder) -> int:  # `macbatch run --replicas N` (docs/distributed.md)
        from macbatch.engine import serve_replica

        return serve_replica(order, group)

    return follow(group, replicate)
