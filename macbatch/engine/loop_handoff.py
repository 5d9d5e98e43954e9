"""Handing the engine thread's outputs to an event loop with one wake-up per step, not per output.

A step of 48 streamed requests makes 48 outputs, each for a callback that passes it to the
event loop of the request's HTTP handler. ``loop.call_soon_threadsafe`` per output writes to the
loop's self-pipe each time, and that write lets go of the GIL: the loop's thread wakes and takes
it, runs its handlers (turning outputs into SSE events, writing sockets) and the engine thread
waits for it back before its next output, so a step's delivery interleaves with the server's
work. ``post_to_loop`` queues the call instead; inside ``held_posts`` (the engine thread's
delivery of one step's outputs) no loop is woken until the block ends, then each loop once, and
outside it a loop is woken only when nothing queued is waiting for it yet. Calls run in the
order they were posted.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any


class _Mailbox:
    """The calls posted to one loop and not run yet."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.woken = False  # a drain is scheduled on the loop

    def post(self, fn: Callable[..., Any], args: tuple[Any, ...], wake: bool) -> None:
        with self.lock:
            self.calls.append((fn, args))
        if wake:
            self.wake()

    def wake(self) -> None:
        """Schedule a drain unless one is scheduled or nothing waits; ``RuntimeError`` (and
        the calls dropped) when the loop is closed."""
        with self.lock:
            if self.woken or not self.calls:
                return
            self.woken = True
        try:
            self.loop.call_soon_threadsafe(self.drain)
        except RuntimeError:  # the loop is closed: nothing queued for it will run
            with self.lock:
                self.calls.clear()
                self.woken = False
            raise

    def drain(self) -> None:
        with self.lock:
            calls, self.calls, self.woken = self.calls, [], False
        for fn, args in calls:
            try:
                fn(*args)
            except Exception as exc:  # reported as the loop reports a failed callback
                self.loop.call_exception_handler(
                    {"message": f"exception in {fn!r} posted to the loop", "exception": exc}
                )


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary()
)
_mailboxes_lock = threading.Lock()
_held = threading.local()  # ``boxes``: the mailboxes posted to inside ``held_posts``


def post_to_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on ``loop`` soon (from any thread), after the calls posted to it
    before; ``RuntimeError`` if the loop is closed, as ``call_soon_threadsafe``."""
    with _mailboxes_lock:
        mailbox = _mailboxes.get(loop)
        if mailbox is None:
            mailbox = _mailboxes[loop] = _Mailbox(loop)
    held: set[_Mailbox] | None = getattr(_held, "boxes", None)
    if held is not None:
        held.add(mailbox)
    mailbox.post(fn, args, wake=held is None)


@contextlib.contextmanager
def held_posts() -> Iterator[None]:
    """Posts made on this thread inside wake their loops once each, when the block ends (a
    closed loop's calls are dropped)."""
    boxes: set[_Mailbox] = set()
    _held.boxes = boxes
    try:
        yield
    finally:
        _held.boxes = None
        for mailbox in boxes:
            with contextlib.suppress(RuntimeError):
                mailbox.wake()
