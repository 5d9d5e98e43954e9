"""A generating job's flat table, ``<job>.csv`` beside its JSONL: one row per result in input
order, with the input's columns, the reply (and a column per field of a ``json_schema`` reply),
the finish reason and the error, and for a scored job whether the reply was ``correct`` (and
``<job>.parquet``, the same rows, when the job file asks).

The JSONL is the record (OpenAI's batch shape, written as requests finish, in completion order,
the answer deep in ``response.body``); a spreadsheet or ``pandas.read_csv`` wants this instead.
Like the vectors file it is rebuilt from the result and error lines when a run ends, so a run
interrupted and resumed writes the same table as one that never stopped. It is written row by
row: a first pass notes where each result line starts (and the parsed fields' names, the
table's columns), a second reads the input and those lines in input order, one at a time, so a
job's results never sit in memory together.
"""

from __future__ import annotations

import heapq
import io
import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from macbatch.batch.inputs import InputFile
from macbatch.batch.paths import errors_path, output_path, parquet_path, table_path, temporary
from macbatch.batch.spec import JobFile
from macbatch.batch.table_files import CsvTable, ParquetTable, TableFile, TableFiles

REPLY_COLUMNS = ("reply", "finish_reason", "error")
SCORE_COLUMN = "correct"  # the result line's macbatch.correct, for a job with score:
NOT_RUN = "not run yet: the run was interrupted; run the same command again to resume"

# Where a result's line starts: which file (RESULT or ERROR) and the byte offset in it.
RESULT, ERROR = 0, 1
Where = tuple[int, int]


def write_job_tables(
    job_file: JobFile,
    sources: dict[str, InputFile | None],
    outputs: dict[str, dict[str, Any]],
    note: Callable[[str], None],
) -> None:
    """Each generating job's tables; their paths go into the job's entry of ``outputs``."""
    for job in job_file.jobs:
        if job.task != "generate":
            continue  # an embed or rerank job's result is its vectors and scores
        directory = job_file.output_dir
        paths = [table_path(directory, job.name)]
        if job_file.parquet:
            paths.append(parquet_path(directory, job.name))
        try:
            write_table(
                paths,
                output_path(directory, job.name),
                errors_path(directory, job.name),
                sources[job.name],
                scored=job.score is not None,
            )
        except (OSError, ValueError, ImportError) as exc:
            note(f"{job.name}: no table: {exc}")
            continue
        outputs[job.name]["table"] = str(paths[0])
        if job_file.parquet:
            outputs[job.name]["parquet"] = str(paths[1])


def write_table(
    paths: list[Path],
    results: Path,
    errors: Path,
    source: InputFile | None,
    scored: bool = False,
) -> None:
    """The table, from a job's result and error lines and its input (None: a job of prompts),
    into each of `paths` (``.csv``, ``.parquet``); `scored`: the job has ``score:``, and the
    table a ``correct`` column (true / false, empty where the row has no expected answer)."""
    where, parsed = _index(results, errors)
    columns = ["custom_id", *_input_columns(source), "sample", *REPLY_COLUMNS]
    columns += [SCORE_COLUMN] if scored else []
    columns += [f"reply.{name}" for name in parsed]
    for path in paths:
        temporary(path).parent.mkdir(parents=True, exist_ok=True)
    with _opened(results) as done, _opened(errors) as failed:
        files = (done, failed)
        with TableFiles([_table_file(temporary(p), columns) for p in paths]) as table:
            for fields, sample, at in _in_order(where, source):
                cells: dict[str, Any] = {"error": NOT_RUN} if at is None else _cells(files, at)
                row = {**fields, **cells, "sample": sample}
                for name, value in cells.get("parsed", {}).items():
                    row[f"reply.{name}"] = _cell(value)
                table.write(row)
    for path in paths:
        os.replace(temporary(path), path)


def _table_file(path: Path, columns: list[str]) -> TableFile:
    if path.name.endswith(".parquet.tmp"):
        return ParquetTable(path, columns)
    return CsvTable(path, columns)


def _opened(path: Path) -> IO[bytes]:
    """A JSONL file to read lines of by offset (empty: the run wrote none)."""
    return path.open("rb") if path.exists() else io.BytesIO()


def _index(results: Path, errors: Path) -> tuple[dict[tuple[int, int], Where], list[str]]:
    """Where each (input line, sample)'s result starts (an error line, written later, wins over
    a result), and the names of the parsed JSON fields, sorted."""
    where: dict[tuple[int, int], Where] = {}
    parsed: set[str] = set()
    for offset, line in _lines(results):
        meta = line["macbatch"]
        where[(meta["line"], meta["sample"])] = (RESULT, offset)
        if isinstance(line.get("parsed"), dict):
            parsed.update(line["parsed"])
    for offset, line in _lines(errors):
        meta = line["macbatch"]
        where[(meta["line"], meta.get("sample", 0))] = (ERROR, offset)
    return where, sorted(parsed)


def _in_order(
    where: dict[tuple[int, int], Where], source: InputFile | None
) -> Iterator[tuple[dict[str, str], int, Where | None]]:
    """(input fields, sample, where its line starts) by input line and sample, merging the
    input (read as it goes) with the results; an input row with none yet has None."""
    rows = () if source is None else source.rows()
    inputs = ((row.line, -1, row.fields) for row in rows if row.fields is not None)
    results = ((line, sample, None) for line, sample in sorted(where))
    merged = heapq.merge(inputs, results, key=lambda entry: entry[:2])
    for line, entries in itertools.groupby(merged, key=lambda entry: entry[0]):
        fields: dict[str, str] = {}
        ran = False
        for _, sample, given in entries:
            if sample < 0:  # the input row comes first: its sample sorts before 0
                fields = {k: _cell(v) for k, v in (given or {}).items() if k != "custom_id"}
                continue
            ran = True
            yield fields, sample, where[(line, sample)]
        if not ran:
            yield fields, 0, None


def _cells(files: tuple[IO[bytes], IO[bytes]], at: Where) -> dict[str, Any]:
    """The cells of the result or error line that starts at `at`."""
    which, offset = at
    file = files[which]
    file.seek(offset)
    line = json.loads(file.readline())
    if which == ERROR:
        return {"custom_id": line["custom_id"], "error": line["error"]["message"]}
    return _result_cells(line)


def _result_cells(line: dict[str, Any]) -> dict[str, Any]:
    """A result line's reply, finish reason and parsed JSON fields."""
    cells: dict[str, Any] = {
        "custom_id": line["custom_id"],
        "reply": _reply_text(line["response"]["body"]),
        "finish_reason": line["macbatch"]["finish_reason"],
        "error": "",
    }
    correct = line["macbatch"].get(SCORE_COLUMN)
    if correct is not None:
        cells[SCORE_COLUMN] = _cell(correct)
    if isinstance(line.get("parsed"), dict):
        cells["parsed"] = line["parsed"]
    return cells


def _reply_text(body: dict[str, Any]) -> str:
    """The first choice's text, whichever API shape answered (chat, completion, Responses)."""
    if "choices" in body:
        choice = body["choices"][0]
        if "message" in choice:
            return choice["message"].get("content") or ""
        return choice.get("text") or ""
    parts = [
        part.get("text", "")
        for item in body.get("output", [])
        for part in item.get("content", []) or []
        if part.get("type") == "output_text"
    ]
    return "".join(parts)


def _input_columns(source: InputFile | None) -> tuple[str, ...]:
    return () if source is None else tuple(c for c in source.header if c != "custom_id")


def _cell(value: Any) -> str:
    """A value as one CSV cell: text as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each line of a JSONL file with the byte offset it starts at."""
    if not path.exists():
        return
    with path.open("rb") as f:
        offset = 0
        for raw in f:
            if raw.strip():
                yield offset, json.loads(raw)
            offset += len(raw)
