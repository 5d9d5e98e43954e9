"""The Batch API's parts, built once per server over its data directory: the file store, the
batch records, the batch thread, and the progress lines ``/metrics`` adds."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from macbatch.engine import EngineThread, Tokenizer
from macbatch.openai import ImageAccess
from macbatch.server.batchapi.files import FileStore
from macbatch.server.batchapi.records import ACTIVE, BatchStore
from macbatch.server.batchapi.run import BatchEngine
from macbatch.server.batchapi.worker import BatchWorker


@dataclass(frozen=True)
class BatchAPI:
    files: FileStore
    batches: BatchStore
    worker: BatchWorker
    max_file_bytes: int
    lock: TextIO  # held while the batch thread runs

    def close(self, wait_s: float) -> None:
        """Stop the batch thread, waiting up to ``wait_s``; once it has ended, let the
        directory go (another server may run its batches)."""
        self.worker.stop(timeout=wait_s)
        if not self.worker.running:
            self.lock.close()

    def metrics(self) -> list[str]:
        """Rows done, failed and total per unfinished batch, and batches per status."""
        batches = self.batches.all()
        lines = [
            "# HELP macbatch_batch_requests Requests of each unfinished batch, by state.",
            "# TYPE macbatch_batch_requests gauge",
        ]
        for batch in batches:
            if batch["status"] in ACTIVE:
                for state, count in batch["request_counts"].items():
                    lines.append(
                        f'macbatch_batch_requests{{batch="{batch["id"]}",state="{state}"}} {count}'
                    )
        lines += [
            "# HELP macbatch_batches Batches kept by this server, by status.",
            "# TYPE macbatch_batches gauge",
        ]
        statuses = sorted({b["status"] for b in batches})
        for status in statuses:
            count = sum(b["status"] == status for b in batches)
            lines.append(f'macbatch_batches{{status="{status}"}} {count}')
        return lines


class BatchAPIUnavailable(RuntimeError):
    """Why this server has no Batch API (answered as a 503 on its routes)."""


def open_batch_api(
    directory: Path,
    thread: EngineThread,
    model: str,
    decoder: Tokenizer,
    room: Callable[[], int],
    max_file_bytes: int,
    images: ImageAccess,
) -> BatchAPI:
    """The stores under ``directory`` and a started batch thread (which resumes at once what a
    previous server left unfinished). One server per directory runs batches: two would run the
    same rows twice, so a second one gets ``BatchAPIUnavailable``."""
    directory.mkdir(parents=True, exist_ok=True)
    lock = _lock(directory / "batches.lock")
    files = FileStore(directory)
    batches = BatchStore(directory)
    worker = BatchWorker(BatchEngine(thread, model, decoder, room, images), batches, files).start()
    return BatchAPI(files, batches, worker, max_file_bytes, lock)


def _lock(path: Path) -> TextIO:
    import fcntl

    # opened, not truncated, and never through a link planted at its name
    lock = open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644), "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise BatchAPIUnavailable(
            f"another macbatch serve runs the Batch API over {path.parent}; use that server "
            "for batches (or stop it)"
        ) from None
    return lock
