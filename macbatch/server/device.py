"""Many engines on one device: their MLX work takes turns.

Each loaded model has its own ``EngineThread``, so each steps on its own thread. MLX's streams
and Metal command buffers are not made for several threads encoding at once, so every MLX call
an engine thread makes (a step, a pool shrink, a load, a call run between steps) holds the
device's one ``Turns`` lock. The lock is first come, first served: an engine that ends its step
while another waits goes behind it, so two busy models alternate step by step and neither
starves the other (``tests/server/test_many_models.py`` checks the alternation from the turn
log). An engine's steps are its own batch of every request it runs, so a model with many
requests does not slow one with a few more than one step each.
"""

from __future__ import annotations

import inspect
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from macbatch.engine import Engine


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


# Engine methods that run no MLX (bookkeeping on the host), called by its thread around every
# step: taking a turn for each would hand the device over three times a step for nothing.
HOST_ONLY = frozenset({"has_unfinished", "stats", "enqueue", "abort", "context_limit"})


class _OnSharedDevice:
    """An engine whose method calls run in a turn of the device, but those in ``HOST_ONLY``
    (attributes, such as its tokenizer and input processor, pass through: they run no MLX)."""

    def __init__(self, engine: Engine, turns: Turns, owner: str) -> None:
        self._engine: Engine | None = engine
        self._turns = turns
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        if self._engine is None:
            raise RuntimeError(f"the engine of {self._owner!r} was unloaded")
        value = getattr(self._engine, name)
        if not inspect.ismethod(value) or name in HOST_ONLY:
            return value

        def in_turn(*args: Any, **kwargs: Any) -> Any:
            with self._turns.turn(self._owner):
                return value(*args, **kwargs)

        return in_turn

    def release(self) -> None:
        """Drop the engine (its weights and pages) once its thread has stopped: the thread
        object outlives its loop, and would otherwise keep the model in memory."""
        self._engine = None


def load_on_device(
    load: Callable[[], Engine], turns: Turns, owner: str
) -> tuple[Callable[[], Engine], Callable[[], None]]:
    """An ``EngineThread`` loader whose load and engine take turns on the device, and the
    function that releases the engine after the thread stopped.

    The engine is wrapped rather than changed so ``EngineThread`` stays as the engine defines
    it; the wrapper answers every attribute the engine has, hence the cast."""
    shared: list[_OnSharedDevice] = []

    def loader() -> Engine:
        with turns.turn(owner):
            engine = load()
        shared.append(_OnSharedDevice(engine, turns, owner))
        return cast("Engine", shared[0])

    def release() -> None:
        for wrapper in shared:
            wrapper.release()

    return loader, release
