"""What keeps a run's output directory sound: one run writes it at a time (a lock file), no
job reads a file the run writes, and Ctrl-C or SIGTERM stop the loop between steps instead of
mid-write."""

from __future__ import annotations

import fnmatch
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath

from macbatch.batch.job_sections import InputSpec
from macbatch.batch.paths import LOCK_NAME, Written, written_files
from macbatch.batch.spec import JobFile
from macbatch.batch.yaml_checks import YamlChecker
from macbatch.batch.yamlfile import JobFileError, PathKey


class Interrupts:
    """Counts SIGINT/SIGTERM instead of raising, so the loop can stop between steps."""

    def __init__(self) -> None:
        self.count = 0

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def caught_signals() -> Iterator[Interrupts]:
    """Count Ctrl-C and SIGTERM from here (the model loaded) on, so one that comes late (every
    line written, the summary being printed) cannot raise halfway and report an interruption
    that did not happen. Once the block ends the run's files are final, so they are ignored
    from then until the process exits: a command-line run ends right after. (An in-process
    caller that runs more afterwards sets its own handlers back.)"""
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, state.handle)
    try:
        yield state
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def refuse_inputs_among_outputs(job_file: JobFile) -> None:
    """Every file the run writes against every input, before anything is read or written: a
    job reading one would see it overwritten or appended to (and --fresh would delete it), and
    two outputs on one path would overwrite each other. The refusal points at the input (or the
    second output) in the job file."""
    check = YamlChecker(job_file.yaml)
    written = written_files(job_file.output_dir, job_file.jobs, job_file.parquet)
    first: dict[Path, Written] = {}
    for output in written:
        other = first.setdefault(output.path.resolve(), output)
        if other.what != output.what:
            raise check.fail(
                output.key,
                f"{output.path} is both {other.what} and {output.what}; give one of them "
                "another name",
            )
    for job in job_file.jobs:
        if job.input is None:
            continue
        folder = job.input.format == "folder"
        key: PathKey = ("jobs", job.index, "input", "folder" if folder else "path")
        for output in written:
            if not _reads(job.input, output.path):
                continue
            reads = (
                f"the files '{job.input.glob}' of {job.input.path}, among them {output.path}, "
                if folder
                else f"{job.input.path}, which is "
            )
            raise check.fail(
                key,
                f"job '{job.name}' reads {reads}{output.what}: a run never writes its input; "
                "read a copy, or write the output elsewhere (output: {dir: ...}, vectors:, "
                "--output-dir)",
            )


def _reads(source: InputSpec, path: Path) -> bool:
    """Whether a job reading ``source`` reads ``path``: the input file (the same file however
    the two are spelled: resolved, or one file on disk, as a case-insensitive volume makes
    ``A`` and ``a``), or a file its folder's glob lists (or will, once it is written)."""
    resolved = source.path.resolve()
    if source.format != "folder":
        return path.resolve() == resolved or (path.exists() and os.path.samefile(path, resolved))
    try:
        parts = path.resolve().relative_to(resolved).parts
    except ValueError:
        return False
    return _globbed(PurePath(source.glob).parts, parts)


def _globbed(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """``Path.glob``'s rule for one path: each part matches its pattern part; ``**`` matches
    any number of parts."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_globbed(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    head = bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0])
    return head and _globbed(pattern[1:], parts[1:])


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
