"""Rank 0 tells every other rank what to do: load a model, run a packed step, or stop.

A message is a fixed two-int header ``[kind, payload length]`` and then an int32 payload, both
broadcast with ``all_sum`` (the other ranks add zeros), so it runs on every backend MLX has and
with any number of ranks. A step's payload is the ``PackedBatch`` itself, encoded field by field
(token ids, positions, cu_seqlens, seq_lens, block tables, KV write rows, sample rows, a hybrid
model's state rows): the followers rebuild exactly the arrays rank 0 built and need no scheduler
or request state.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import threading
from enum import IntEnum
from functools import cache
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.config import EngineConfig
from macbatch.engine.distributed.watchdog import process_watchdog
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.recurrent import StateRows


class MessageKind(IntEnum):
    LOAD = 1
    STEP = 2
    STOP = 3
    REPLICATE = 4  # every rank loads the whole model and runs its own engine (replicas.py)


class PeerLostError(RuntimeError):
    """A collective failed because another rank is gone; the group cannot go on."""


@dataclasses.dataclass(frozen=True)
class LoadOrder:
    """What every rank loads: the model name rank 0 was given and its engine settings."""

    model: str
    config: EngineConfig


# Field encodings: a tag, then the value.
_INT, _ARRAY, _ARRAYS_BY_INT, _INTS, _NONE, _STATE_ROWS = 0, 1, 2, 3, 4, 5


def encode_batch(batch: PackedBatch) -> np.ndarray:
    """The batch as one int32 vector, every field in declaration order."""
    parts: list[np.ndarray] = []
    for field in _wire_fields():
        value = getattr(batch, field.name)
        encodable = int | mx.array | dict | list | StateRows | None
        if isinstance(value, bool) or not isinstance(value, encodable):
            raise TypeError(
                f"PackedBatch.{field.name} ({type(value).__name__}) has no wire encoding; "
                "add one in macbatch/engine/distributed/channel.py"
            )
        if value is None:
            parts.append(np.array([_NONE], np.int32))
        elif isinstance(value, StateRows):  # rebuilt from what it was built from
            parts += [np.array([_STATE_ROWS], np.int32), _encode_array(field.name, value.wire)]
        elif isinstance(value, int):
            parts.append(np.array([_INT, value], np.int32))
        elif isinstance(value, list):
            parts.append(np.array([_INTS, len(value), *value], np.int32))
        elif isinstance(value, mx.array):
            parts += [np.array([_ARRAY], np.int32), _encode_array(field.name, value)]
        else:
            parts.append(np.array([_ARRAYS_BY_INT, len(value)], np.int32))
            for key, array in value.items():
                parts += [np.array([key], np.int32), _encode_array(field.name, array)]
    return np.concatenate(parts)


def _encode_array(name: str, array: mx.array | np.ndarray) -> np.ndarray:
    if array.dtype not in (mx.int32, np.int32):
        raise TypeError(f"PackedBatch.{name} is {array.dtype}; only int32 arrays are broadcast")
    head = np.array([array.ndim, *array.shape], np.int32)
    return np.concatenate([head, np.asarray(array).reshape(-1)])


def decode_batch(data: np.ndarray) -> PackedBatch:
    """The inverse of ``encode_batch``."""
    reader = _Reader(data)
    values: dict[str, Any] = {}
    for field in _wire_fields():
        tag = reader.take(1)[0]
        if tag == _INT:
            values[field.name] = int(reader.take(1)[0])
        elif tag == _ARRAY:
            values[field.name] = mx.array(reader.array())
        elif tag == _NONE:
            values[field.name] = None
        elif tag == _STATE_ROWS:
            values[field.name] = StateRows.from_wire(reader.array())
        elif tag == _INTS:
            values[field.name] = [int(v) for v in reader.take(int(reader.take(1)[0]))]
        elif tag == _ARRAYS_BY_INT:
            count = int(reader.take(1)[0])
            arrays = {int(reader.take(1)[0]): mx.array(reader.array()) for _ in range(count)}
            values[field.name] = arrays
        else:
            raise ValueError(f"corrupt step message: field {field.name} has tag {tag}")
    if reader.offset != len(data):
        raise ValueError("corrupt step message: bytes left over after the last field")
    return PackedBatch(**values)


class _Reader:
    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.offset = 0

    def take(self, count: int) -> np.ndarray:
        chunk = self.data[self.offset : self.offset + count]
        self.offset += count
        return chunk

    def array(self) -> np.ndarray:
        ndim = int(self.take(1)[0])
        shape = [int(n) for n in self.take(ndim)]
        return self.take(int(np.prod(shape))).reshape(shape)


class StepChannel:
    """One per process and group. Rank 0 sends, the others receive; each call is a collective
    that every rank must make at the same point."""

    def __init__(self, group: mx.distributed.Group) -> None:
        self.group = group
        self.rank = group.rank()
        self.who = f"rank {self.rank} of {group.size()}"
        self.watchdog = process_watchdog()
        self.watchdog.who = self.who
        self.messages = 0
        self.payload_ints = 0
        # Held by rank 0 from a step's broadcast until its results are evaluated, so the stop
        # sent at exit never interleaves with a step's collectives.
        self._step = threading.Lock()
        self._stopped = False
        if self.rank == 0:
            atexit.register(self.send_stop)

    # -- rank 0 ------------------------------------------------------------------------------

    def send_load(self, order: LoadOrder) -> None:
        self._exchange(MessageKind.LOAD, _order_payload(order))

    def send_replicate(self, order: LoadOrder) -> None:
        """Make every rank a whole-model replica (``replicas.py``); this channel then carries
        nothing more, so no stop is sent at exit (the replicas' exchange ends them)."""
        self._exchange(MessageKind.REPLICATE, _order_payload(order))
        self._stopped = True

    def send_step(self, batch: PackedBatch) -> None:
        """Broadcast one step; the watchdog stays armed until ``step_finished``."""
        if self._stopped:
            raise RuntimeError(f"{self.who}: the other ranks were released; no step can run")
        self._step.acquire()
        self.watchdog.arm(f"step {self.messages}", batch.num_tokens)
        try:
            self._exchange(MessageKind.STEP, encode_batch(batch))
        except BaseException:
            # No step is in flight: an armed watchdog would kill this process mid-cleanup (the
            # run's ledger, the server's answers) and a held lock would skip the stop at exit.
            self.step_finished()
            raise

    def step_finished(self) -> None:
        self.watchdog.disarm()
        self._step.release()

    def send_stop(self) -> None:
        """Tell the followers to exit, once (skipped if a step is still in flight: they then exit
        on the closed connection instead)."""
        if not self._stopped and self._step.acquire(timeout=1.0):
            self._stopped = True
            try:
                self.watchdog.arm("sending stop")
                self._exchange(MessageKind.STOP, np.zeros(0, np.int32))
            except PeerLostError:
                pass  # the followers are gone already: nothing to stop
            finally:
                self.watchdog.disarm()

    # -- other ranks -------------------------------------------------------------------------

    def receive(self) -> tuple[MessageKind, np.ndarray]:
        """Wait (without a deadline: rank 0 may be idle) for rank 0's next message."""
        return self._exchange(None, None)

    @staticmethod
    def load_order(payload: np.ndarray) -> LoadOrder:
        data = json.loads(payload.astype(np.uint8).tobytes().decode())
        return LoadOrder(data["model"], EngineConfig(**data["config"]))

    # -- both --------------------------------------------------------------------------------

    def _exchange(
        self, kind: MessageKind | None, payload: np.ndarray | None
    ) -> tuple[MessageKind, np.ndarray]:
        header = np.zeros(2, np.int32)
        if kind is not None and payload is not None:
            header[:] = (kind, payload.size)
        try:
            header = self._broadcast(header)
            size = int(header[1])
            body = np.zeros(size, np.int32) if payload is None else payload.astype(np.int32)
            body = self._broadcast(body) if size else body
        except RuntimeError as exc:
            raise PeerLostError(
                f"{self.who}: the distributed group lost a rank ({exc}). Every rank must be "
                "restarted together (mlx.launch ...); `macbatch run` resumes from its ledger."
            ) from exc
        self.messages += 1
        self.payload_ints += size + 2
        return MessageKind(int(header[0])), body

    def _broadcast(self, values: np.ndarray) -> np.ndarray:
        total = mx.distributed.all_sum(mx.array(values), group=self.group, stream=mx.cpu)
        return np.asarray(total)


def _order_payload(order: LoadOrder) -> np.ndarray:
    text = json.dumps({"model": order.model, "config": dataclasses.asdict(order.config)})
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


@cache
def channel_of(group: mx.distributed.Group) -> StepChannel:
    """The one channel of ``group`` in this process."""
    return StepChannel(group)


def _wire_fields() -> list[dataclasses.Field]:
    """The batch's fields every rank needs (not the ones marked ``rank_local``)."""
    return [f for f in dataclasses.fields(PackedBatch) if not f.metadata.get("rank_local")]
