"""What every rank but 0 runs: load what rank 0 loads, then run each step it broadcasts.

A follower holds no request state, writes no file and opens no port: its only inputs are rank 0's
messages, and its only work is the packed forward over its shard and its KV pool.
"""

from __future__ import annotations

import sys

import mlx.core as mx

from macbatch.engine.distributed.channel import (
    MessageKind,
    PeerLostError,
    StepChannel,
    channel_of,
    decode_batch,
)
from macbatch.engine.engine import Engine
from macbatch.engine.packing import PackedBatch


def follow(group: mx.distributed.Group) -> int:
    """Serve rank 0 until it says stop; the exit status for the process."""
    channel = channel_of(group)
    try:
        kind, payload = channel.receive()
        if kind is MessageKind.STOP:
            return 0
        if kind is not MessageKind.LOAD:
            raise RuntimeError(f"{channel.who}: expected a load message first, got {kind.name}")
        order = StepChannel.load_order(payload)
        engine = Engine.load(order.model, order.config)
        sys.stderr.write(f"macbatch {channel.who}: loaded its shard of {order.model}\n")
        run_steps(engine, channel)
    except PeerLostError as exc:
        # Rank 0 exiting without a stop (a crash, or `serve` leaving at once) lands here too.
        sys.stderr.write(f"{exc}\n")
        return 1
    except Exception as exc:  # a model this rank cannot load or shard: say so, then exit
        sys.stderr.write(f"macbatch {channel.who}: error: {exc}\n")
        return 1
    return 0


def run_steps(engine: Engine, channel: StepChannel) -> None:
    """Run every broadcast step's forward on this rank's shard until the stop message."""
    while True:
        kind, payload = channel.receive()
        if kind is MessageKind.STOP:
            return
        if kind is not MessageKind.STEP:
            raise RuntimeError(f"{channel.who}: unexpected {kind.name} message during serving")
        batch = decode_batch(payload)
        channel.watchdog.arm(f"step {channel.messages}", batch.num_tokens)
        follow_step(engine, batch)
        channel.watchdog.disarm()


def follow_step(engine: Engine, batch: PackedBatch) -> None:
    """Rank 0's step on this rank's shard: the same layers, so the same collectives in the same
    order, and this rank's K/V written. Not the LM head: it is not split and only rank 0
    samples, so computing it here would only delay this rank's next step (and so rank 0's)."""
    hidden = engine.adapter.hidden_states(batch, engine.store)
    # A step that samples no row (it only writes K/V) ends on rank 0 at the last K/V write, so
    # the last layer's collectives after it are not run there, and must not be run here.
    mx.eval(*([hidden] if batch.sample_rows.size else []), *engine.store.arrays())
