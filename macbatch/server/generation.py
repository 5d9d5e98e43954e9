"""The engine requests behind one HTTP request, seen from the event loop.

Requests are submitted up front, templated and tokenized on a worker thread (so bad input is a 400
before any byte of a stream is sent, and no other request waits on the work); their
outputs arrive on one asyncio queue, merged in arrival order. ``close()`` is synchronous so it also
runs under cancellation (a client that disconnects mid-stream): it cancels every unfinished
request, and the engine frees its KV blocks on its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable

from macbatch.engine import (
    EngineDeadError,
    EngineThread,
    FinishReason,
    PoolingParams,
    PromptInput,
    RequestOutput,
    SamplingParams,
    post_to_loop,
)
from macbatch.server.errors import APIError, engine_unavailable, invalid
from macbatch.server.metrics import ServerMetrics

# what one HTTP request asks the engine for: a prompt and its sampling or pooling, per request
Jobs = tuple[tuple[PromptInput, SamplingParams | PoolingParams], ...]
LIVENESS_CHECK_S = 0.5  # how often a waiting handler checks that the engine thread is alive


class Admission:
    """Bounds the engine requests in flight (running plus waiting); beyond it, 429."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pending = 0

    def take(self, count: int) -> None:
        """Admit ``count`` engine requests: 429 while others fill the server, 400 if ``count``
        alone passes the limit (retrying could never help)."""
        if count > self.capacity:
            raise invalid(
                f"this request needs {count} engine requests (prompts x n), more than the server "
                f"admits at once ({self.capacity}); ask for fewer choices",
                "n",
            )
        if self.pending + count > self.capacity:
            raise APIError(
                429,
                f"the server is busy: {self.pending} requests are running or queued "
                f"(limit {self.capacity}); retry later",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        self.pending += count

    def give_back(self, count: int) -> None:
        self.pending -= count


class Run:
    """Submits ``jobs`` (choice index = position) and yields ``(index, output)`` as they come.

    ``await start()`` templates and tokenizes on a worker thread (the input processor is
    thread-safe): a 4 MB prompt takes seconds to tokenize, and on the event loop it would stall
    every stream and /health meanwhile."""

    def __init__(
        self,
        thread: EngineThread,
        jobs: Jobs,
        metrics: ServerMetrics,
        prompt_param: str = "messages",
    ) -> None:
        self._thread = thread
        self._prompt_param = prompt_param  # the body field a bad chat prompt's 400 names
        self._jobs = jobs
        self._metrics = metrics
        self._queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()  # the submitting worker and close() on the loop
        self._closed = False
        self._request_ids: list[str] = []
        self._unfinished: set[int] = set()
        self._first_token_seen: set[int] = set()

    async def start(self) -> None:
        """Submit every job; a 400 (or 503) if one cannot run, with nothing left queued."""
        try:
            await asyncio.to_thread(self._submit_all)
        except ValueError as exc:
            self.close()
            chat = self._jobs[0][0].is_chat
            param = self._prompt_param if chat or self._prompt_param == "input" else "prompt"
            raise invalid(str(exc), param) from None
        except EngineDeadError as exc:
            self.close()
            raise engine_unavailable(str(exc)) from None
        except BaseException:  # whatever else failed (or the client left), nothing stays queued
            self.close()
            raise

    def _submit_all(self) -> None:
        """On a worker thread. A request submitted after close() (the handler was cancelled
        while this ran) is cancelled at once."""
        for index, (prompt, params) in enumerate(self._jobs):
            request_id = self._thread.submit(prompt, params, self._deliver(index))
            with self._lock:
                if self._closed:
                    self._thread.cancel(request_id)
                    return
                self._request_ids.append(request_id)
                self._unfinished.add(index)

    def _deliver(self, index: int) -> Callable[[RequestOutput], None]:
        """The callback run on the engine thread: hand the output to the event loop."""

        def on_output(out: RequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # a closed event loop: the server is gone
                post_to_loop(self._loop, self._queue.put_nowait, (index, out))

        return on_output

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs until every request finished; APIError if one fails or the engine dies."""
        while self._unfinished:
            try:
                index, out = await asyncio.wait_for(self._queue.get(), LIVENESS_CHECK_S)
            except asyncio.TimeoutError:
                if not self._thread.alive:
                    raise engine_unavailable(_describe(self._thread.error)) from None
                continue
            if index not in self._unfinished:
                continue  # a late output of a request already cancelled
            # a pooling request's one output is its first (prompt tokens counted; no TTFT)
            first = index not in self._first_token_seen and (
                out.metrics.first_token_time or out.embedding is not None or out.score is not None
            )
            if first:
                self._first_token_seen.add(index)
            self._metrics.record(out, bool(first))
            if out.finished:
                self._unfinished.discard(index)
                if out.finish_reason is FinishReason.ERROR:
                    self._raise_for_error(out)
            yield index, out

    def _raise_for_error(self, out: RequestOutput) -> None:
        """An ERROR finish: 503 if the engine died, 500 if its step failed on this request
        (the engine serves the others on), else this request was unservable (400)."""
        if not self._thread.alive:
            raise engine_unavailable(_describe(self._thread.error))
        if out.step_failed:
            raise APIError(
                500, out.error or "the engine failed on this request", code="engine_error"
            )
        raise invalid(out.error or "the engine could not run this request")

    def close(self) -> None:
        """Cancel whatever has not finished (idempotent, never awaits)."""
        with self._lock:
            self._closed = True
            unfinished = sorted(self._unfinished)
            self._unfinished.clear()
        for index in unfinished:
            self._thread.cancel(self._request_ids[index])
            self._metrics.record_abort()


def _describe(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"
