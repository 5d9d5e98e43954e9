"""Many engines on one device: their MLX work takes turns.

Each loaded model has its own ``EngineThread``, so each steps on its own thread. MLX's streams and
Metal command buffers are not made for several threads encoding at once, so every MLX call an engine
thread makes (its load, a step, a pool shrink, a call run between steps, its close) holds the
device's one ``Turns`` lock, which the thread is given (``EngineThread(device=...)``); its
bookkeeping on the host between steps (queueing, aborting, reading stats) takes no turn, or it would
hand the device over several times a step for nothing. The lock is first come, first served: an
engine that ends its step while another waits goes behind it, so two busy models alternate step by
step and neither starves the other (``tests/server/test_many_models.py`` checks the alternation from
the turn log). An engine's steps are its own batch of every request it runs, so a model with many
requests does not slow one with a few more than one step each.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    """A first-come, first-served lock over the device; ``log`` (when kept) records who took
    each turn and whether another engine was waiting for it then."""

    def __init__(self, keep_log: bool = False) -> None:
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()
        self._held = False
        self.log: list[tuple[str, bool]] | None = [] if keep_log else None

    @contextmanager
    def turn(self, owner: str) -> Iterator[None]:
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._held or self._queue[0] is not ticket:
                self._cond.wait()
            self._queue.popleft()
            self._held = True
            if self.log is not None:
                self.log.append((owner, bool(self._queue)))
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()


class OwnDevice:
    """The device of an engine alone on it (``EngineThread`` without ``device``): every turn is
    its own at once."""

    @contextmanager
    def turn(self, owner: str) -> Iterator[None]:
        yield
