"""Messages between whole-model replicas (``macbatch run --replicas N`` under ``mlx.launch``), in
rounds of MLX's own ``all_gather`` on a thread of their own.

Why rounds and not point-to-point: MLX's ring backend sends and receives only between neighbours
in the ring (rank 2 of 4 cannot reach rank 0), and a blocking ``recv`` would need rank 0 to know
who speaks next. A round is a collective every rank makes: each contributes its outbox (pickled
``{destination rank: [message, ...]}``, empty bytes when it has nothing), and each keeps what is
addressed to it. Rounds run on this module's thread, over their own CPU stream, so they never wait
for an engine step; an idle round is one ``all_gather`` of one int per rank, and idle rounds slow
down to one every ``MAX_IDLE_S``.

A round that raises (the ring lost a peer) or makes no progress for ``MACBATCH_PEER_TIMEOUT``
seconds (a peer frozen or unreachable) marks the exchange broken (``problem``); its owner stops.
Rank 0 ends the rounds by marking its last one final (``finish``): every rank stops after it.
"""

from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.distributed.watchdog import TIMEOUT_VARIABLE, timeout_from_env

# The pause after a round in which nobody had anything to say: IDLE_S, doubling with each quiet
# round up to MAX_IDLE_S (every rank sees the same rounds, so all pause alike). An idle round is
# not free: MLX's ring backend spent 1.5 to 3 ms of CPU per round here (2 loaded cores).
IDLE_S = 0.01
MAX_IDLE_S = 0.1


def gather_bytes(
    data: bytes, group: mx.distributed.Group, stream: mx.Stream | mx.DeviceType = mx.cpu
) -> list[bytes]:
    """Every rank's ``data``, by rank (a collective: every rank calls it at the same point).
    Sizes first, then, when any rank has bytes, all payloads padded to the longest."""
    sizes = mx.distributed.all_gather(
        mx.array([len(data)], dtype=mx.int32), group=group, stream=stream
    )
    mx.eval(sizes)  # waits with the GIL released
    lengths = [int(n) for n in np.array(sizes)]
    width = max(lengths)
    if width == 0:
        return [b""] * len(lengths)
    padded = np.zeros(width, np.uint8)
    padded[: len(data)] = np.frombuffer(data, np.uint8)
    rows = mx.distributed.all_gather(mx.array(padded), group=group, stream=stream)
    mx.eval(rows)
    table = np.array(rows).reshape(len(lengths), width)
    return [table[rank, :length].tobytes() for rank, length in enumerate(lengths)]


class Exchange:
    """This rank's side of the rounds: ``post`` a message to a rank, ``take`` what arrived."""

    def __init__(self, group: mx.distributed.Group) -> None:
        self.group = group
        self.rank = group.rank()
        self.timeout_s = timeout_from_env()
        self.rounds = 0
        self.busy_s = 0.0  # this thread's CPU time in rounds that carried messages
        self._lock = threading.Condition()
        self._outbox: dict[int, list[Any]] = {}
        self._inbox: list[tuple[int, Any]] = []
        self._final = False
        self._ended = False
        self._error: str | None = None
        self._last_round = time.monotonic()
        self._pause = IDLE_S
        self._thread = threading.Thread(target=self._run, name="macbatch-exchange", daemon=True)
        self._thread.start()

    def post(self, destination: int, message: Any) -> None:
        """Send ``message`` (any picklable object) to rank ``destination`` in the next round."""
        with self._lock:
            self._outbox.setdefault(destination, []).append(message)
            self._lock.notify_all()  # an idle round goes at once

    def take(self) -> list[tuple[int, Any]]:
        """The messages that arrived since the last call: (sender's rank, message)."""
        with self._lock:
            arrived, self._inbox = self._inbox, []
        return arrived

    def wait(self, seconds: float) -> None:
        """Until a message arrives, the rounds end, or ``seconds`` pass."""
        with self._lock:
            if not self._inbox and not self._ended:
                self._lock.wait(seconds)

    @property
    def ended(self) -> bool:
        """Rank 0's final round is over: every rank has stopped exchanging."""
        return self._ended and self._error is None

    def problem(self) -> str | None:
        """Why the exchange cannot go on (a peer lost or not answering), or None."""
        if self._error is not None:
            return self._error
        if self._ended:
            return None
        waited = time.monotonic() - self._last_round
        if waited > self.timeout_s:
            return (
                f"rank {self.rank}: the replicas' exchange made no progress for {waited:.0f} s: "
                "another rank died or stopped answering (host asleep or unreachable, or the "
                f"process hung). Set {TIMEOUT_VARIABLE} (seconds) to wait longer."
            )
        return None

    def finish(self, seconds: float) -> None:
        """(Rank 0) make the next round the last, and wait up to ``seconds`` for it."""
        with self._lock:
            self._final = True
            self._lock.notify_all()
        self._thread.join(seconds)

    def _run(self) -> None:
        stream = mx.new_stream(mx.cpu)  # rounds never queue behind an engine step
        try:
            while self._round(stream):
                pass
        except Exception as exc:
            self._error = (
                f"rank {self.rank}: the replicas' exchange lost a rank ({exc}). Rerun the same "
                "command (on the same or fewer ranks): `macbatch run` resumes from its ledger."
            )
        with self._lock:
            self._ended = True
            self._lock.notify_all()

    def _round(self, stream: mx.Stream) -> bool:
        """One round; False after the final one."""
        with self._lock:
            outbox, self._outbox = self._outbox, {}
            final = self._final
        started = time.thread_time()
        data = pickle.dumps((final, outbox)) if outbox or final else b""
        blobs = gather_bytes(data, self.group, stream)
        arrived: list[tuple[int, Any]] = []
        last = False
        for sender, blob in enumerate(blobs):
            if not blob:
                continue
            is_final, messages = pickle.loads(blob)
            last = last or (sender == 0 and is_final)
            arrived += [(sender, message) for message in messages.get(self.rank, [])]
        quiet = not any(blobs)
        if not quiet:
            self.busy_s += time.thread_time() - started
        with self._lock:
            self._inbox += arrived
            self._last_round = time.monotonic()
            self.rounds += 1
            if arrived:
                self._lock.notify_all()
            self._pause = min(2 * self._pause, MAX_IDLE_S) if quiet else IDLE_S
            if quiet and not self._outbox and not self._final:
                self._lock.wait(self._pause)
        return not last
