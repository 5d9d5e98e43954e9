"""One batch's requests through the server's engine, exactly once: the job runner's plan, ledger
and output files (``macbatch/batch/``), fed from the batch thread with ``EngineThread.submit``.

Live requests come first: the batch keeps at most ``room()`` requests in the engine, which
leaves the running batch's other sequences to live requests (docs/serve.md)."""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from macbatch.batch.ledger import Ledger
from macbatch.batch.outputs import JsonlAppender, error_line, recover, write_result
from macbatch.batch.paths import errors_path, output_path
from macbatch.batch.pending import Pending
from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.preparing import Preparing
from macbatch.batch.replies import ReplyShape
from macbatch.engine import EngineDeadError, EngineThread, Request, RequestOutput, Tokenizer
from macbatch.openai import ImageAccess
from macbatch.server.batchapi.inputs import batch_job

LEDGER_NAME = "ledger.sqlite"
POLL_S = 0.1  # how often a waiting batch looks at cancels, stops and the engine's health
log = logging.getLogger("macbatch.server")


@dataclass(frozen=True)
class BatchEngine:
    """What a batch needs of the server: its engine, model name, decoder and live load."""

    thread: EngineThread
    model: str
    decoder: Tokenizer
    room: Callable[[], int]  # batch requests allowed in the engine right now
    images: ImageAccess  # where rows' images may come from: the server's rules


class BatchRun:
    """Runs (or resumes) one batch in ``folder`` until it is done or ``stopped()`` says so."""

    def __init__(self, engine: BatchEngine, batch_id: str, input_path: Path, folder: Path) -> None:
        self.engine = engine
        self.job = batch_job(batch_id, input_path)
        self.output = output_path(folder, batch_id)
        self.errors_file = errors_path(folder, batch_id)
        self.ledger = Ledger(folder / LEDGER_NAME)
        recover(self.output, self.ledger, batch_id)
        self.errors_file.unlink(missing_ok=True)  # failures are retried, as a rerun of a job
        self.completed = self.ledger.count(batch_id)
        self.failed = 0
        # finished requests, and None when a line is done preparing (it wakes ``_wait``)
        self._outputs: queue.Queue[RequestOutput | None] = queue.Queue()
        self._pending: Pending[tuple[Planned, ReplyShape | None]] = Pending()  # lines in flight
        # lines being templated and tokenized off the batch thread: a huge one holds up no other
        self._preparing: Preparing[tuple[Planned, ReplyShape | None], Request] = Preparing(
            lambda request: engine.thread.prepare(*request), lambda: self._outputs.put(None)
        )
        self._appender: JsonlAppender | None = None
        self._errors: JsonlAppender | None = None

    def run(self, stopped: Callable[[], bool], on_progress: Callable[[], None]) -> bool:
        """Admit and finish requests; True when every request is done (False: stopped)."""
        exhausted = aborted = False
        try:
            feed = plan_job(self.job, self.engine.model, prepare(self.job), self.engine.images)
            self._appender = JsonlAppender(self.output)
            while True:
                stop = stopped()
                if stop and not aborted:
                    for request_id in self._pending.request_ids():
                        self.engine.thread.cancel(request_id)
                    aborted = True
                while not stop and not exhausted and self._has_room():
                    exhausted = not self._admit(next(feed, None))
                if stop:
                    self._preparing.close()
                self._queue_prepared(wait=not self._pending)
                if not self._pending and not self._preparing and (exhausted or stop):
                    return exhausted and not stop
                if self._pending:
                    self._wait()
                on_progress()
        finally:
            self.close()

    def close(self) -> None:
        self._preparing.close()
        for appender in (self._appender, self._errors):
            if appender is not None:
                appender.close()
        self._appender = self._errors = None
        self.ledger.close()

    def _wait(self) -> None:
        try:
            out = self._outputs.get(timeout=POLL_S)
        except queue.Empty:
            if not self.engine.thread.alive:
                raise EngineDeadError("the engine stopped during a batch") from None
            return
        if out is not None:  # None: a line is ready to queue, which the loop does next
            self._finish(out)

    def _admit(self, item: Planned | Rejected | None) -> bool:
        """Submit one line's requests (or write its error line); False when the plan is
        exhausted. A line is admitted whole, so it may pass ``room()`` by its requests less
        one (an embeddings row's inputs, a body's n choices)."""
        if item is None:
            return False
        if isinstance(item, Rejected):
            self._fail(item, item.reason, "invalid_input")
            return True
        if self.ledger.lookup(item.job, item.custom_id, item.sample) is not None:
            return True
        try:
            bound = item.bind(self.engine.thread.info.model, self.engine.decoder)
        except Exception as exc:  # a tool the model cannot honour ...
            self._fail(item, str(exc), "invalid_request")
            return True
        self._preparing.start((item, bound.shape), item.key, bound.requests)
        return True

    def _has_room(self) -> bool:
        in_flight = len(self._pending) + len(self._preparing)
        return in_flight < self.engine.room() and self._preparing.has_room

    def _queue_prepared(self, wait: bool) -> None:
        """Queue the lines done preparing (all of a line's requests, or none and its error
        line); ``wait``: for one, when no output can come meanwhile."""
        thread = self.engine.thread
        enqueue = lambda request: thread.enqueue(request, self._deliver)  # noqa: E731
        fail = lambda row, why: self._fail(row[0], why, "invalid_request")  # noqa: E731
        self._preparing.queue_ready(self._pending, enqueue, thread.cancel, fail, wait)

    def _deliver(self, out: RequestOutput) -> None:
        """On the engine thread: hand finished requests to the batch thread."""
        if out.finished:
            self._outputs.put(out)

    def _finish(self, out: RequestOutput) -> None:
        if out.request_id not in self._pending:  # aborted when its line could not be queued
            return
        settled = self._pending.settle(out, self.engine.thread.cancel)
        if settled is None:
            return
        (item, shape), outputs = settled.row, settled.outputs
        if settled.error is not None:
            self._fail(item, settled.error, "engine_error")
            return
        assert self._appender is not None
        body = item.reply_body(outputs, shape, self.engine.model, self.engine.decoder)
        parsed = None if shape is None else shape.parse(outputs[0].text)
        write_result(self._appender, self.ledger, item, outputs, body, parsed=parsed)
        self.completed += 1

    def _fail(self, item: Planned | Rejected, reason: str, code: str) -> None:
        if self._errors is None:
            self._errors = JsonlAppender(self.errors_file)
        self._errors.append(error_line(item, reason, code))
        self.failed += 1
