"""A generating job's flat table, ``<job>.csv`` beside its JSONL: one row per result in input
order, with the input's columns, the reply (and a column per field of a ``json_schema`` reply),
the finish reason and the error.

The JSONL is the record (OpenAI's batch shape, written as requests finish, in completion order,
the answer deep in ``response.body``); a spreadsheet or ``pandas.read_csv`` wants this instead.
Like the vectors file it is rebuilt from the result and error lines when a run ends, so a run
interrupted and resumed writes the same table as one that never stopped.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from macbatch.batch.inputs import InputFile
from macbatch.batch.paths import errors_path, output_path, table_path, temporary
from macbatch.batch.spec import JobFile

REPLY_COLUMNS = ("reply", "finish_reason", "error")
NOT_RUN = "not run yet: the run was interrupted; run the same command again to resume"


def write_job_tables(
    job_file: JobFile,
    sources: dict[str, InputFile | None],
    outputs: dict[str, dict[str, Any]],
    note: Callable[[str], None],
) -> None:
    """Each generating job's table; its path goes into the job's entry of ``outputs``."""
    for job in job_file.jobs:
        if job.task != "generate":
            continue  # an embed or rerank job's result is its vectors and scores
        directory = job_file.output_dir
        path = table_path(directory, job.name)
        try:
            write_table(
                path,
                output_path(directory, job.name),
                errors_path(directory, job.name),
                sources[job.name],
            )
        except (OSError, ValueError) as exc:
            note(f"{job.name}: no table: {exc}")
            continue
        outputs[job.name]["table"] = str(path)


def write_table(path: Path, results: Path, errors: Path, source: InputFile | None) -> None:
    """The table from a job's result and error lines and its input (None: a job of prompts)."""
    done: dict[tuple[int, int], dict[str, Any]] = {}
    for line in _lines(results):
        meta = line["macbatch"]
        done[(meta["line"], meta["sample"])] = _result_cells(line)
    for line in _lines(errors):
        meta = line["macbatch"]
        error = line["error"]["message"]
        done[(meta["line"], meta.get("sample", 0))] = {
            "custom_id": line["custom_id"],
            "error": error,
        }
    inputs = _input_fields(source)
    parsed = sorted({k for cells in done.values() for k in cells.get("parsed", {})})
    columns = ["custom_id", *_input_columns(source), "sample", *REPLY_COLUMNS]
    columns += [f"reply.{name}" for name in parsed]
    temporary(path).parent.mkdir(parents=True, exist_ok=True)
    with temporary(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for row_line, sample, cells in _in_order(done, inputs):
            row = {**inputs.get(row_line, {}), **cells, "sample": sample}
            for name, value in cells.get("parsed", {}).items():
                row[f"reply.{name}"] = _cell(value)
            writer.writerow(row)
    os.replace(temporary(path), path)


def _in_order(
    done: dict[tuple[int, int], dict[str, Any]], inputs: dict[int, dict[str, str]]
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Results by input line and sample; an input row with none yet says it has not run."""
    lines = sorted({line for line, _ in done} | set(inputs))
    samples: dict[int, list[int]] = {}
    for line, sample in done:
        samples.setdefault(line, []).append(sample)
    for line in lines:
        if line not in samples:
            yield line, 0, {"error": NOT_RUN}
        for sample in sorted(samples.get(line, [])):
            yield line, sample, done[(line, sample)]


def _result_cells(line: dict[str, Any]) -> dict[str, Any]:
    """A result line's reply, finish reason and parsed JSON fields."""
    cells: dict[str, Any] = {
        "custom_id": line["custom_id"],
        "reply": _reply_text(line["response"]["body"]),
        "finish_reason": line["macbatch"]["finish_reason"],
        "error": "",
    }
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


def _input_fields(source: InputFile | None) -> dict[int, dict[str, str]]:
    """Each readable input row's fields as cells, by line number."""
    if source is None:
        return {}
    return {
        row.line: {k: _cell(v) for k, v in row.fields.items() if k != "custom_id"}
        for row in source.rows()
        if row.fields is not None
    }


def _cell(value: Any) -> str:
    """A value as one CSV cell: text as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                yield json.loads(raw)
