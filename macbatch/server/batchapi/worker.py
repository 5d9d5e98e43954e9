"""The batch thread: runs the server's batches one at a time, oldest first, and resumes those a
stopped (or killed) server left unfinished. A batch ends by moving its output and errors into
the file store, in steps a restart can repeat (ids saved first, then the files moved, then the
status saved)."""

from __future__ import annotations

import logging
import os
import threading

from macbatch.batch.paths import errors_path, output_path
from macbatch.batch.yamlfile import JobFileError
from macbatch.engine import EngineDeadError
from macbatch.server.batchapi.files import FileStore, new_file_id
from macbatch.server.batchapi.records import BatchStore
from macbatch.server.batchapi.run import BatchEngine, BatchRun
from macbatch.server.errors import within

log = logging.getLogger("macbatch.server")


class BatchWorker:
    def __init__(self, engine: BatchEngine, batches: BatchStore, files: FileStore) -> None:
        self.engine = engine
        self.batches = batches
        self.files = files
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cancelled: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="macbatch-batches", daemon=True)

    def start(self) -> BatchWorker:
        self._thread.start()
        return self

    def wake(self) -> None:
        """A batch was created or cancelled."""
        self._wake.set()

    def cancel(self, batch_id: str) -> None:
        self._cancelled.add(batch_id)
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop admitting batch requests (those in flight are aborted, to rerun on resume)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            active = self.batches.active()
            if not active:
                self._wake.wait()
                continue
            try:
                self._process(active[0])
            except EngineDeadError:
                log.warning("the engine stopped; unfinished batches resume when serve restarts")
                return
            except Exception as exc:  # the batch's own fault or a bug: that batch fails
                self._fail(active[0], exc)

    def _fail(self, batch_id: str, exc: Exception) -> None:
        """The batch fails, saying why; the thread goes on to the next one, even when the
        failure cannot be saved (its folder gone, the disk full): it holds in memory."""
        log.exception("batch %s failed", batch_id)
        message = within(f"{type(exc).__name__}: {exc}", self.batches.root)
        errors = {"object": "list", "data": [{"code": "batch_failed", "message": message}]}
        try:
            self.batches.set_status(batch_id, "failed", fields={"errors": errors})
        except Exception:
            log.exception("batch %s: its failure could not be saved", batch_id)

    def _process(self, batch_id: str) -> None:
        batch = self.batches.get(batch_id)
        if batch.get("_end") is not None:  # stopped while finalizing: finish that
            self._finalize(batch_id, batch["_end"])
            return
        folder = self.batches.folder(batch_id)
        path = self.files.content_path(batch["input_file_id"])
        if not path.exists():
            raise JobFileError(f"the input file {batch['input_file_id']} is gone")
        run = BatchRun(self.engine, batch_id, path, folder)
        self.batches.set_status(batch_id, "in_progress", when=("validating",))
        done = run.run(lambda: self._halted(batch_id), lambda: self._count(run, batch_id))
        self._count(run, batch_id)
        if self._stop.is_set():
            return  # the server is stopping: the batch stays active and resumes on restart
        self._finalize(batch_id, "completed" if done else "cancelled")

    def _halted(self, batch_id: str) -> bool:
        cancelling = batch_id in self._cancelled
        return (
            self._stop.is_set()
            or cancelling
            or self.batches.get(batch_id)["status"] == ("cancelling")
        )

    def _count(self, run: BatchRun, batch_id: str) -> None:
        self.batches.count(batch_id, run.completed, run.failed)

    def _finalize(self, batch_id: str, end: str) -> None:
        """Ids and the end first (saved with ``_end``, so a restart repeats only the rest),
        then the files move, then the final status."""
        folder = self.batches.folder(batch_id)
        moves = {"output_file_id": output_path(folder, batch_id)}
        moves["error_file_id"] = errors_path(folder, batch_id)
        batch = self.batches.get(batch_id)
        if batch.get("_end") is None:
            ids = {key: _id_if_any(path) for key, path in moves.items()}
            status = "finalizing" if end == "completed" else "cancelling"
            batch = self.batches.set_status(batch_id, status, fields={"_end": end, **ids})
        for key, source in moves.items():
            file_id = batch[key]
            if file_id is None:
                continue
            if source.exists():
                os.replace(source, self.files.content_path(file_id))
            kind = "output" if key == "output_file_id" else "error"
            self.files.adopt(file_id, f"{batch_id}_{kind}.jsonl", "batch_output")
        self.batches.set_status(batch_id, batch["_end"])
        self._cancelled.discard(batch_id)


def _id_if_any(path: os.PathLike) -> str | None:
    """A file id for a batch result that has lines; None for an empty or missing one."""
    return new_file_id() if os.path.exists(path) and os.path.getsize(path) > 0 else None
