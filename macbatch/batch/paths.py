"""Every file a run writes, named in one place: each job's results, errors and table, an embed
job's vectors and their ids, the output directory's ledger (with SQLite's files beside it), lock and
summary, and the temporary files the whole-file rewrites go through. The input guard
(``run_guard``) checks every input against ``written_files``, so a file named here is guarded
the moment it is written."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from macbatch.batch.spec import JobSpec
from macbatch.batch.yamlfile import PathKey

LEDGER_NAME = ".macbatch-ledger.sqlite"
LEDGER_SIDECARS = ("-wal", "-shm", "-journal")  # SQLite writes these beside the ledger
LOCK_NAME = ".macbatch.lock"
SUMMARY_NAME = "summary.json"


@dataclass(frozen=True)
class Written:
    """A file the run writes, what it is, and the job-file key that decides its path."""

    path: Path
    what: str
    key: PathKey


def output_path(directory: Path, job: str) -> Path:
    return directory / f"{job}.jsonl"


def table_path(directory: Path, job: str) -> Path:
    """A generating job's flat table (``table.py``)."""
    return directory / f"{job}.csv"


def parquet_path(directory: Path, job: str) -> Path:
    """The same table as Parquet, when the job file asks (``output: {parquet: true}``)."""
    return directory / f"{job}.parquet"


def errors_path(directory: Path, job: str) -> Path:
    return directory / f"{job}.errors.jsonl"


def ids_path(vectors: Path) -> Path:
    """The file naming each row of a vectors matrix."""
    return vectors.with_name(vectors.stem + ".ids.json")


def temporary(path: Path) -> Path:
    """Where a file rewritten whole is written before it is renamed over ``path``."""
    return path.with_name(path.name + ".tmp")


def rebuilt_files(directory: Path, job: JobSpec, parquet: bool = False) -> list[Path]:
    """A job's files rebuilt from its result lines when a run ends (tables, vectors and their
    ids): a run deletes them as it starts, so they never describe another run than the lines."""
    files = []
    if job.task == "generate":
        files.append(table_path(directory, job.name))
        if parquet:
            files.append(parquet_path(directory, job.name))
    if job.vectors is not None:
        files += [job.vectors, ids_path(job.vectors)]
    return files


def written_files(directory: Path, jobs: Iterable[JobSpec], parquet: bool = False) -> list[Written]:
    """Every file a run of ``jobs`` into output directory ``directory`` may write (`parquet`:
    the job file asks for Parquet tables too)."""
    ledger = directory / LEDGER_NAME
    here: PathKey = ("output", "dir")
    files = [Written(ledger.with_name(ledger.name + s), "the resume ledger", here)
             for s in ("", *LEDGER_SIDECARS)]  # fmt: skip
    files.append(Written(directory / LOCK_NAME, "the run's lock file", here))
    whole = [Written(directory / SUMMARY_NAME, "the run's summary", here)]
    for job in jobs:
        name: PathKey = ("jobs", job.index, "name")
        whole.append(Written(output_path(directory, job.name), f"job '{job.name}''s results", name))
        files.append(Written(errors_path(directory, job.name), f"job '{job.name}''s errors", name))
        if job.task == "generate":
            whole.append(
                Written(table_path(directory, job.name), f"job '{job.name}''s table", name)
            )
            if parquet:
                what = f"job '{job.name}''s Parquet table"
                whole.append(Written(parquet_path(directory, job.name), what, name))
        if job.vectors is not None:
            key: PathKey = ("jobs", job.index, "vectors")
            whole.append(Written(job.vectors, f"job '{job.name}''s vectors", key))
            whole.append(Written(ids_path(job.vectors), f"job '{job.name}''s vector ids", key))
    return files + whole + [Written(temporary(w.path), w.what, w.key) for w in whole]
