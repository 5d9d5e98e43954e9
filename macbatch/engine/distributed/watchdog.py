"""Ends the process when a step that needs every rank stops making progress.

MLX's ring backend raises at once when a peer's process dies (its sockets close), but a host that
stops answering (asleep, cable pulled, hung) leaves a collective waiting forever: TCP cannot tell
a slow peer from a lost one. Every step is therefore armed with a deadline; a step that misses it
prints what happened and exits, so rank 0 never hangs. ``macbatch run`` resumes from its ledger
after such an exit exactly as after ``kill -9``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

# Exit status of a process stopped by the watchdog (sysexits' EX_UNAVAILABLE).
EXIT_PEER_TIMEOUT = 69
TIMEOUT_VARIABLE = "MACBATCH_PEER_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0


def timeout_from_env() -> float:
    """Seconds one step may take before the group is declared broken (``MACBATCH_PEER_TIMEOUT``)."""
    raw = os.environ.get(TIMEOUT_VARIABLE)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ValueError(f"{TIMEOUT_VARIABLE} must be a positive number of seconds, got {raw!r}")
    return value


class Watchdog:
    """A daemon thread that exits the process if an armed step is not disarmed in time."""

    def __init__(self, timeout_s: float, who: str) -> None:
        self.timeout_s = timeout_s
        self.who = who
        self._lock = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        threading.Thread(target=self._watch, name="macbatch-watchdog", daemon=True).start()

    def arm(self, what: str) -> None:
        with self._lock:
            self._deadline = time.monotonic() + self.timeout_s
            self._what = what
            self._lock.notify()

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._deadline is None:
                    self._lock.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                sys.stderr.write(
                    f"error: {self.who}: {self._what} made no progress for {self.timeout_s:g} s: "
                    "another rank stopped answering (host asleep or unreachable, or the process "
                    f"hung). Stopping this rank. Set {TIMEOUT_VARIABLE} (seconds) if steps of "
                    "this model legitimately take longer.\n"
                )
                sys.stderr.flush()
                os._exit(EXIT_PEER_TIMEOUT)
