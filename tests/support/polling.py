"""Waiting for a condition another thread makes true (a server's counter, an engine's state),
with a deadline, so a test neither sleeps a fixed time nor hangs when the condition never comes.
Shared by tests in several packages, hence here rather than in a conftest."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
