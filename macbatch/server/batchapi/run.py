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
from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.pooled import Pending, PooledRow
from macbatch.batch.replies import ReplyShape
from macbatch.engine import EngineDeadError, EngineThread, FinishReason, RequestOutput, Tokenizer
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
        self._outputs: queue.Queue[RequestOutput] = queue.Queue()
        self._in_flight: dict[str, tuple[Planned, ReplyShape | None]] = {}  # None: pooled
        self._pending = Pending()  # pooled rows' requests in flight
        self._appender: JsonlAppender | None = None
        self._errors: JsonlAppender | None = None

    def run(self, stopped: Callable[[], bool], on_progress: Callable[[], None]) -> bool:
        """Admit and finish requests; True when every request is done (False: stopped)."""
        exhausted = aborted = False
        try:
            feed = plan_job(self.job, self.engine.model, prepare(self.job))
            self._appender = JsonlAppender(self.output)
            while True:
                stop = stopped()
                if stop and not aborted:
                    for request_id in list(self._in_flight):
                        self.engine.thread.cancel(request_id)
                    aborted = True
                while not stop and not exhausted and len(self._in_flight) < self.engine.room():
                    exhausted = not self._admit(next(feed, None))
                if not self._in_flight and (exhausted or stop):
                    return exhausted and not stop
                self._wait()
                on_progress()
        finally:
            self.close()

    def close(self) -> None:
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
        self._finish(out)

    def _admit(self, item: Planned | Rejected | None) -> bool:
        """Submit one request (or write one error line); False when the plan is exhausted."""
        if item is None:
            return False
        if isinstance(item, Rejected):
            self._fail(item, item.reason, "invalid_input")
            return True
        if self.ledger.lookup(item.job, item.custom_id, item.sample) is not None:
            return True
        if item.pooled is not None:
            self._admit_pooled(item, item.pooled)
            return True
        thread = self.engine.thread
        try:
            bound = item.bind(thread.info.model.tool_format, self.engine.decoder)
            request_id = thread.submit(bound.prompt, bound.params, self._deliver)
        except EngineDeadError:
            raise
        except Exception as exc:  # ValueError, or a chat template that rejects the messages
            self._fail(item, str(exc), "invalid_request")
            return True
        self._in_flight[request_id] = (item, bound.shape)
        return True

    def _admit_pooled(self, item: Planned, row: PooledRow) -> None:
        """Submit all of a pooled row's requests (an embeddings body with several inputs is
        several), or none and an error line."""
        thread = self.engine.thread
        try:
            requests = row.bind(thread.info.model.embedding, self.engine.decoder)
            submit = lambda prompt, params: thread.submit(prompt, params, self._deliver)  # noqa: E731
            request_ids = self._pending.submit(item, item.key, requests, submit, thread.cancel)
        except EngineDeadError:
            raise
        except Exception as exc:  # ValueError: too long, a model that cannot embed ...
            self._fail(item, str(exc), "invalid_request")
            return
        self._in_flight.update(dict.fromkeys(request_ids, (item, None)))

    def _deliver(self, out: RequestOutput) -> None:
        """On the engine thread: hand finished requests to the batch thread."""
        if out.finished:
            self._outputs.put(out)

    def _finish(self, out: RequestOutput) -> None:
        entry = self._in_flight.pop(out.request_id, None)
        if entry is None:
            return
        item, shape = entry
        if shape is None:
            self._finish_pooled(out)
            return
        if out.finish_reason is FinishReason.ABORT:
            return  # cancelled or shutting down: not done, so a resume runs it again
        if out.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            self._fail(item, out.error or f"finished with {out.finish_reason}", "engine_error")
            return
        assert self._appender is not None
        body = item.reply_body(out, shape.tool_format, self.engine.model, self.engine.decoder)
        write_result(self._appender, self.ledger, item, out, body, parsed=shape.parse(out.text))
        self.completed += 1

    def _finish_pooled(self, out: RequestOutput) -> None:
        """Gather a pooled row's outputs; its line (the embeddings response) after the last."""
        settled = self._pending.settle(out, self.engine.thread.cancel)
        if settled is not None and settled.error is not None:
            self._fail(settled.item, settled.error, "engine_error")
        elif settled is not None:
            assert self._appender is not None
            body = settled.body(self.engine.model)
            write_result(self._appender, self.ledger, settled.item, settled.outputs[0], body)
            self.completed += 1

    def _fail(self, item: Planned | Rejected, reason: str, code: str) -> None:
        if self._errors is None:
            self._errors = JsonlAppender(self.errors_file)
        self._errors.append(error_line(item, reason, code))
        self.failed += 1
