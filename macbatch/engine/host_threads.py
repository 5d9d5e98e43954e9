"""The OS threads engine loops run on, reused: an engine's loop that ends hands its thread to the
next engine started, so a server that loads and unloads models for days keeps as many threads as
it ever had engines at once.

Why not a thread per engine: a thread that used MLX must never end (with MLX 0.32 on CPU the
process then aborts at exit, "terminate called without an active exception"), and a parked one
keeps its own glibc malloc arena, whose freed pages stay in the RSS, and MLX's per-thread streams
with their two worker threads. ``benchmarks/soak.py`` saw the RSS climb a model's worth per load
that way (about 134 MiB for each load of ``demo`` in a load-and-unload loop, three OS threads
more each time); one thread reused for every load stays flat.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_Loop = tuple[Callable[[], None], str, threading.Event]  # the loop, its thread's name, its end
_idle: list[_Host] = []  # hosts whose last loop has ended, waiting for the next
_hosts: list[_Host] = []  # every host started (none ever ends)
_lock = threading.Lock()


class _Host:
    """One daemon thread that runs the loops handed to it, one after another, and never ends
    (a daemon, so it never keeps the process from exiting)."""

    def __init__(self) -> None:
        self._loops: queue.SimpleQueue[_Loop] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="macbatch-engine", daemon=True).start()

    def run(self, loop: _Loop) -> None:
        self._loops.put(loop)

    def _serve(self) -> None:
        while True:
            loop, name, ended = self._loops.get()
            threading.current_thread().name = name
            try:
                loop()
            except BaseException:  # a loop reports its own failures; this keeps the host
                log.exception("an engine loop raised past its own handling")
            threading.current_thread().name = "macbatch-engine-idle"
            with _lock:
                _idle.append(self)
            ended.set()


def run_loop(loop: Callable[[], None], name: str, ended: threading.Event) -> None:
    """Run ``loop`` on an idle host thread (named ``name`` while it runs), or a new one;
    ``ended`` is set once the loop has returned and its host is idle again, so an engine started
    after it reuses that host."""
    with _lock:
        host = _idle.pop() if _idle else None
        if host is None:
            host = _Host()
            _hosts.append(host)
    host.run((loop, name, ended))


def host_count() -> int:
    """How many host threads this process has started (idle or busy: none ever ends)."""
    with _lock:
        return len(_hosts)
