"""Rows' requests templated and tokenized on a small pool of worker threads, so one huge row never
holds up the others: the loop that steps the engine (``macbatch run``) or waits for its outputs
(the Batch API) queues a row here and goes on; a row whose requests are ready is handed back, in
the order rows become ready, to be queued in the engine. The input processor is thread-safe.

Bounded: ``WORKERS`` rows are prepared at once (a huge row holds one of them) and at most
``AHEAD`` rows wait here, so a file of huge rows never has them all in memory at once.
"""

from __future__ import annotations

import concurrent.futures as futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from macbatch.batch.pending import Abort, Pending, Request
from macbatch.engine import EngineDeadError

Row = TypeVar("Row")
Prepared = TypeVar("Prepared")  # what a request becomes: the engine's ``Request``
WORKERS = 2
AHEAD = 8
WAIT_S = 0.2


@dataclass(frozen=True)
class Ready(Generic[Row, Prepared]):
    """A row done preparing: its requests ready for the engine, or why they cannot run."""

    row: Row
    key: str
    requests: list[Prepared]
    error: Exception | None = None


class Preparing(Generic[Row, Prepared]):
    def __init__(
        self, prepare: Callable[[Request], Prepared], on_ready: Callable[[], None] | None = None
    ) -> None:
        """``on_ready``: called (on a worker thread) when a row is done preparing, for a caller
        that blocks on something else meanwhile (the Batch API waits for outputs)."""
        self._prepare = prepare
        self._on_ready = on_ready
        self._pool = futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="macbatch-prepare")
        self._rows: dict[futures.Future[list[Prepared]], tuple[Row, str, int]] = {}

    def __len__(self) -> int:
        """The requests of the rows being prepared (they count as in flight)."""
        return sum(count for _, _, count in self._rows.values())

    @property
    def has_room(self) -> bool:
        return len(self._rows) < AHEAD

    def start(self, row: Row, key: str, requests: Sequence[Request]) -> None:
        """Prepare a row's requests (all of them, or the row fails) on a worker thread."""
        future = self._pool.submit(lambda: [self._prepare(r) for r in requests])
        self._rows[future] = (row, key, len(requests))
        if self._on_ready is not None:
            on_ready = self._on_ready
            future.add_done_callback(lambda _: on_ready())

    def queue_ready(
        self,
        pending: Pending[Row],
        enqueue: Callable[[Prepared], str],
        abort: Abort,
        fail: Callable[[Row, str], None],
        wait: bool,
    ) -> None:
        """Queue the rows done preparing in the engine through ``pending`` (all of a row's
        requests, or none and ``fail(row, why)``); ``wait``: for one, when nothing else would
        let the caller go on."""
        for ready in self.ready(wait):
            try:
                if ready.error is not None:
                    raise ready.error
                pending.submit(ready.row, ready.key, ready.requests, enqueue, abort)
            except EngineDeadError:
                raise
            except Exception as exc:  # ValueError (too long ...), a template that refuses
                fail(ready.row, str(exc))

    def ready(self, wait: bool = False) -> list[Ready[Row, Prepared]]:
        """The rows done preparing (``wait``: for one, if any is being prepared, up to
        ``WAIT_S``, so that the caller still sees a Ctrl-C or a stop meanwhile)."""
        if wait and self._rows:
            futures.wait(self._rows, WAIT_S, return_when=futures.FIRST_COMPLETED)
        done = []
        for future in [f for f in self._rows if f.done()]:
            row, key, _ = self._rows.pop(future)
            error = future.exception()
            if error is not None and not isinstance(error, Exception):
                raise error
            requests = [] if error is not None else future.result()
            done.append(Ready(row, key, requests, error))
        return done

    def close(self) -> None:
        """Drop the rows not started; a worker still preparing one finishes it and stops."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._rows.clear()
