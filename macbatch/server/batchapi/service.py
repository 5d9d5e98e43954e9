"""The Batch API's parts, built once per server over its data directory: the file store, the
batch records, the batch thread, and the progress lines ``/metrics`` adds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from macbatch.engine import EngineThread
from macbatch.engine.tokenizer import Tokenizer
from macbatch.server.batchapi.files import FileStore
from macbatch.server.batchapi.records import ACTIVE, BatchStore
from macbatch.server.batchapi.run import Engine
from macbatch.server.batchapi.worker import BatchWorker


@dataclass(frozen=True)
class BatchAPI:
    files: FileStore
    batches: BatchStore
    worker: BatchWorker
    max_file_bytes: int

    def metrics(self) -> list[str]:
        """Rows done, failed and total per unfinished batch, and batches per status."""
        batches = self.batches.all()
        lines = ["# HELP macbatch_batch_requests Requests of each unfinished batch, by state.",
                 "# TYPE macbatch_batch_requests gauge"]  # fmt: skip
        for batch in batches:
            if batch["status"] in ACTIVE:
                for state, count in batch["request_counts"].items():
                    lines.append(
                        f'macbatch_batch_requests{{batch="{batch["id"]}",state="{state}"}} {count}'
                    )
        lines += ["# HELP macbatch_batches Batches kept by this server, by status.",
                  "# TYPE macbatch_batches gauge"]  # fmt: skip
        statuses = sorted({b["status"] for b in batches})
        for status in statuses:
            count = sum(b["status"] == status for b in batches)
            lines.append(f'macbatch_batches{{status="{status}"}} {count}')
        return lines


def open_batch_api(
    directory: Path,
    thread: EngineThread,
    model: str,
    decoder: Tokenizer,
    room: Callable[[], int],
    max_file_bytes: int,
) -> BatchAPI:
    """The stores under ``directory`` and a started batch thread (which resumes at once what a
    previous server left unfinished)."""
    files = FileStore(directory / "files")
    batches = BatchStore(directory / "batches")
    worker = BatchWorker(Engine(thread, model, decoder, room), batches, files).start()
    return BatchAPI(files, batches, worker, max_file_bytes)
