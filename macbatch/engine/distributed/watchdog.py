"""Ends the process when a step that needs every rank stops making progress.

MLX's ring backend raises at once when a peer's process dies between collectives, but not always
inside a step: when the peer dies while one ``mx.eval`` holds several of the forward's all_sums,
the survivor reports "Too many send/recv errors. Failing pending tasks..." and then waits forever
on the next one (measured with MLX 0.32.4 on Linux; see docs/distributed.md). A host that stops
answering (asleep, cable pulled, hung) also leaves a collective waiting forever: TCP cannot tell a
slow peer from a lost one. So every step gets a deadline, ten times what steps have taken so far
(``Watchdog.deadline_s``), never less than ``MACBATCH_PEER_TIMEOUT`` (default 10 s), and at least
a minute until a few steps have been timed (the first ones may compile kernels or page in
weights). A step that misses its deadline prints what happened and exits; ``macbatch run``
resumes from its ledger after such an exit exactly as after ``kill -9``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

# Exit status of a process stopped by the watchdog (sysexits' EX_UNAVAILABLE).
EXIT_PEER_TIMEOUT = 69
TIMEOUT_VARIABLE = "MACBATCH_PEER_TIMEOUT"
DEFAULT_TIMEOUT_S = 10.0
SAFETY = 10.0
WARMUP_STEPS = 3
WARMUP_TIMEOUT_S = 60.0


def timeout_from_env() -> float:
    """The shortest deadline a step gets, in seconds (``MACBATCH_PEER_TIMEOUT``)."""
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

    def __init__(self, floor_s: float, who: str) -> None:
        self.floor_s = floor_s
        self.who = who
        self._lock = threading.Condition()
        self._started: float | None = None
        self._deadline = 0.0
        self._tokens = 0
        self._what = ""
        self._timed_steps = 0
        self._slowest_per_token = 0.0
        self._slowest_step = 0.0
        self._largest_step = 0
        threading.Thread(target=self._watch, name="macbatch-watchdog", daemon=True).start()

    def deadline_s(self, tokens: int) -> float:
        """Seconds a step of ``tokens`` tokens may take before the group counts as broken.

        Two bounds from the steps seen so far, the tighter one wins: the slowest seconds per token
        times ``tokens`` (tight for small steps, whose cost is mostly per step), and the slowest
        step scaled up when this one is bigger than any seen (tight for big prefill steps)."""
        tokens = max(tokens, 1)
        per_token = self._slowest_per_token * tokens
        per_step = self._slowest_step * max(1.0, tokens / max(self._largest_step, 1))
        expected = SAFETY * min(per_token, per_step)
        floor = self.floor_s if self._timed_steps >= WARMUP_STEPS else WARMUP_TIMEOUT_S
        return max(floor, self.floor_s, expected)

    def arm(self, what: str, tokens: int = 1) -> None:
        """Start the deadline of a step of ``tokens`` tokens."""
        with self._lock:
            self._started = time.monotonic()
            self._tokens = tokens
            self._deadline = self._started + self.deadline_s(tokens)
            self._what = what
            self._lock.notify()

    def disarm(self) -> None:
        with self._lock:
            if self._started is not None:
                took = time.monotonic() - self._started
                self._slowest_per_token = max(self._slowest_per_token, took / max(self._tokens, 1))
                self._slowest_step = max(self._slowest_step, took)
                self._largest_step = max(self._largest_step, self._tokens)
                self._timed_steps += 1
            self._started = None

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._started is None:
                    self._lock.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                waited = time.monotonic() - self._started
                sys.stderr.write(
                    f"error: {self.who}: {self._what} made no progress for {waited:.0f} s: "
                    "another rank died or stopped answering (host asleep or unreachable, or the "
                    f"process hung). Stopping this rank. Set {TIMEOUT_VARIABLE} (seconds) if "
                    "steps of this model legitimately take longer.\n"
                )
                sys.stderr.flush()
                os._exit(EXIT_PEER_TIMEOUT)


@cache
def process_watchdog() -> Watchdog:
    """The one watchdog of this process (its thread lives as long as the process)."""
    return Watchdog(timeout_from_env(), "macbatch")


# The guard process: wait for this one to close the pipe (done, or dead); else report and kill it.
_GUARD = """
import os, select, sys
seconds, pid, signum, message = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if not ready:
    sys.stderr.write(message)
    sys.stderr.flush()
    os.kill(pid, signum)
"""


@contextmanager
def guarded(seconds: float, what: str) -> Iterator[None]:
    """A deadline for a call that holds the GIL, where the watchdog thread could not run (MLX's
    connect in ``mx.distributed.init`` does): a tiny child process waits for the call to end,
    and otherwise prints why and kills this process."""
    message = (
        f"error: {what} made no progress for {seconds:g} s: a rank in the hostfile is not "
        "running or cannot be reached at its address and port. Stopping.\n"
    )
    command = [sys.executable, "-S", "-c", _GUARD, str(seconds), str(os.getpid())]
    guard = subprocess.Popen(command + [str(int(signal.SIGKILL)), message], stdin=subprocess.PIPE)
    try:
        yield
    finally:
        assert guard.stdin is not None
        guard.stdin.close()
        guard.wait()
