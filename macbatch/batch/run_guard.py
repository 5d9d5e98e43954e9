"""What keeps a run's output directory sound: one run writes it at a time (a lock file), no
job reads a file the run writes, and Ctrl-C or SIGTERM stop the loop between steps instead of
mid-write."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from macbatch.batch.outputs import errors_path, output_path
from macbatch.batch.spec import JobFile
from macbatch.batch.yamlfile import JobFileError

LEDGER_NAME = ".macbatch-ledger.sqlite"
LOCK_NAME = ".macbatch.lock"
SUMMARY_NAME = "summary.json"


class Interrupts:
    """Counts SIGINT/SIGTERM instead of raising, so the loop can stop between steps."""

    def __init__(self) -> None:
        self.count = 0

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1


@contextmanager
def caught_signals() -> Iterator[Interrupts]:
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = {sig: signal.signal(sig, state.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def refuse_inputs_among_outputs(job_file: JobFile) -> None:
    """A job reading a file this run writes would append its results to its own input (and a
    --fresh run would delete it): refused before anything is read or written."""
    directory = job_file.output_dir
    written = {directory / name for name in (LEDGER_NAME, LOCK_NAME, SUMMARY_NAME)}
    for job in job_file.jobs:
        written |= {output_path(directory, job.name), errors_path(directory, job.name)}
    written = {path.resolve() for path in written}
    for job in job_file.jobs:
        if job.input is not None and job.input.path.resolve() in written:
            raise JobFileError(
                f"job '{job.name}' reads {job.input.path}, a file this run writes its results "
                f"to; move the input out of the output directory {directory} or set a "
                "different output dir"
            )


@contextmanager
def exclusive(directory: Path) -> Iterator[None]:
    """One run per output directory: two writers would break exactly-once output."""
    import fcntl

    try:
        lock_file = (directory / LOCK_NAME).open("w")
    except OSError as exc:
        raise JobFileError(
            f"cannot write to the output directory {directory}: {exc.strerror or exc}; make it "
            "writable or set a different output dir (output: {dir: ...} or --output-dir)"
        ) from None
    with lock_file as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobFileError(
                f"another macbatch run is writing to {directory}; wait for it to finish "
                "or set a different output dir"
            ) from None
        yield
