"""What every rank but 0 runs: load what rank 0 loads, then run each step it broadcasts.

A follower holds no request state, writes no file and opens no port: its only inputs are rank 0's
messages, and its only work is the packed forward over its shard and its KV pool, through a
``ModelRunner`` built from the model and the engine settings alone (no tokenizer, scheduler or
engine core).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import mlx.core as mx

from macbatch.engine.distributed.channel import (
    LoadOrder,
    MessageKind,
    PeerLostError,
    StepChannel,
    channel_of,
    decode_batch,
)
from macbatch.engine.distributed.loading import load, settle_drafting
from macbatch.engine.distributed.ranks import ranks_of
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.worker.model_runner import ModelRunner


def follow(group: mx.distributed.Group, replicate: Callable[[LoadOrder], int] | None = None) -> int:
    """Serve rank 0 until it says stop; the exit status for the process. ``replicate``: what to
    run when rank 0 makes every rank a whole-model replica (it is the engine's ``serve_replica``,
    passed in so that this module never imports the engine core)."""
    channel = channel_of(group)
    try:
        kind, payload = channel.receive()
        if kind is MessageKind.STOP:
            return 0
        if kind is MessageKind.REPLICATE and replicate is not None:
            return replicate(StepChannel.load_order(payload))
        if kind is not MessageKind.LOAD:
            raise RuntimeError(f"{channel.who}: expected a load message first, got {kind.name}")
        order = StepChannel.load_order(payload)
        model, _, _ = load(order.model, order.config)  # on this process's group
        mode = settle_drafting(None, group)
        if mode is None:
            sys.stderr.write(f"macbatch {channel.who}: rank 0 could not load its drafter\n")
            channel.receive()  # the stop rank 0 sends as it exits with the reason
            return 1
        config = dataclasses.replace(order.config, speculative=mode)
        # The same collectives as rank 0's engine makes while it builds its runner.
        runner = ModelRunner(model, config, owns_model=True, ranks=ranks_of(group))
        sys.stderr.write(
            f"macbatch {channel.who}: loaded its shard of {order.model} (speculative {mode})\n"
        )
        run_steps(runner, channel)
    except PeerLostError as exc:
        # Rank 0 exiting without a stop (a crash, or `serve` leaving at once) lands here too.
        sys.stderr.write(f"{exc}\n")
        return 1
    except Exception as exc:  # a model this rank cannot load or shard: say so, then exit
        sys.stderr.write(f"macbatch {channel.who}: error: {exc}\n")
        return 1
    return 0


def run_steps(runner: ModelRunner, channel: StepChannel) -> None:
    """Run every broadcast step's forward on this rank's shard until the stop message."""
    while True:
        kind, payload = channel.receive()
        if kind is MessageKind.STOP:
            return
        if kind is not MessageKind.STEP:
            raise RuntimeError(f"{channel.who}: unexpected {kind.name} message during serving")
        batch = decode_batch(payload)
        channel.watchdog.arm(f"step {channel.messages}", batch.num_tokens)
        follow_step(runner, batch)
        channel.watchdog.disarm()


def follow_step(runner: ModelRunner, batch: PackedBatch) -> None:
    """One of rank 0's steps on this rank's shard (``ModelRunner.follow``)."""
    runner.follow(batch)
