"""Input files (csv, tsv, jsonl, OpenAI batch jsonl), read lazily one row at a time.

Opening an input checks what can be checked without reading it all: the file is readable, the
header (csv) or first row (jsonl) exists, and the format. Rows are then streamed, so a
100,000-line input never sits in memory; a broken row becomes a `Row` with a `problem` instead of
stopping the job.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.batch.job_sections import InputSpec
from macbatch.batch.yamlfile import JobFileError
from macbatch.openai import InvalidRequest
from macbatch.openai.bodies import MAX_NESTING, check_value, parse_json

csv.field_size_limit(1 << 30)
# A folder input's row: the file's name (its id, unless input.id says otherwise) and its path.
FOLDER_FIELDS = ("id", "file", "path")


@dataclass(frozen=True)
class Row:
    """One input record: its 1-based line number and fields, or why it could not be read."""

    line: int
    fields: dict[str, Any] | None
    problem: str | None = None


@dataclass(frozen=True)
class InputFile:
    """An opened, header-checked input; `rows()` reads it from the start each time it is called."""

    path: Path
    format: str
    header: tuple[str, ...]

    glob: str = "*"

    def rows(self) -> Iterator[Row]:
        if self.format == "folder":
            return _folder_rows(self.path, self.glob)
        if self.format in ("csv", "tsv"):
            return _csv_rows(self.path, "\t" if self.format == "tsv" else ",")
        return jsonl_rows(self.path)


def open_input(spec: InputSpec, job: str) -> InputFile:
    """Check the file and its header; JobFileError names the job and the file."""
    if spec.format == "folder":
        if next(_folder_rows(spec.path, spec.glob), None) is None:
            raise JobFileError(f"job '{job}': no file in {spec.path} matches '{spec.glob}'")
        return InputFile(spec.path, "folder", FOLDER_FIELDS, spec.glob)
    try:
        if spec.format in ("csv", "tsv"):
            header = _csv_header(spec.path, "\t" if spec.format == "tsv" else ",", job)
            return InputFile(spec.path, spec.format, header)
        first = next((row for row in jsonl_rows(spec.path) if row.fields is not None), None)
    except OSError as exc:
        raise JobFileError(f"job '{job}': cannot read {spec.path}: {exc}") from None
    if first is None:
        raise JobFileError(
            f"job '{job}': {spec.path} has no valid JSON object on any line; "
            "each line of a .jsonl file must be one JSON object"
        )
    fields = first.fields or {}
    looks_openai = "custom_id" in fields and "body" in fields
    fmt = spec.format
    if fmt == "jsonl" and looks_openai:
        fmt = "openai"
    if fmt == "openai" and not looks_openai:
        raise JobFileError(
            f"job '{job}': {spec.path} line {first.line} is not an OpenAI batch request "
            "(it needs 'custom_id' and 'body'); use format: jsonl for plain rows"
        )
    return InputFile(spec.path, fmt, tuple(fields))


def _csv_header(path: Path, delimiter: str, job: str) -> tuple[str, ...]:
    with path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
        header = next((r for r in csv.reader(f, delimiter=delimiter) if r), None)
    if header is None:
        raise JobFileError(
            f"job '{job}': {path} is empty; a csv input needs a header line naming its columns"
        )
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise JobFileError(
            f"job '{job}': {path} line 1: duplicate column names: {', '.join(duplicates)}"
        )
    return tuple(header)


def _csv_rows(path: Path, delimiter: str) -> Iterator[Row]:
    with path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header: list[str] | None = None
        previous_end = 0
        while True:
            try:
                values = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield Row(previous_end + 1, None, f"unreadable csv record: {exc}")
                previous_end = reader.line_num
                continue
            start, previous_end = previous_end + 1, reader.line_num
            if not values:
                continue
            if header is None:
                header = values
                continue
            if len(values) != len(header):
                yield Row(start, None, f"has {len(values)} fields but the header has {len(header)}")
                continue
            yield Row(start, dict(zip(header, values, strict=True)))


def jsonl_rows(path: Path) -> Iterator[Row]:
    """Each non-blank line as a row: a JSON object of Unicode text nested at most MAX_NESTING
    deep, or why it is not (the Batch API checks a batch's file with this same reader)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                value = parse_json(raw.decode("utf-8"), "the row")
                check_value(value, "the row")
            except UnicodeDecodeError as exc:
                yield Row(number, None, f"not UTF-8 text: {exc.reason} at byte {exc.start}")
                continue
            except json.JSONDecodeError as exc:
                yield Row(number, None, f"invalid JSON: {exc.msg} at column {exc.colno}")
                continue
            except RecursionError:
                yield Row(number, None, f"the row nests more than {MAX_NESTING} levels deep")
                continue
            except InvalidRequest as exc:  # too deep, a lone surrogate, NaN, a huge number
                yield Row(number, None, str(exc))
                continue
            if not isinstance(value, dict):
                yield Row(number, None, f"expected a JSON object, got {type(value).__name__}")
                continue
            yield Row(number, value)


def _folder_rows(folder: Path, glob: str) -> Iterator[Row]:
    """One row per file matching ``glob``, in name order (so a resumed job sees the same rows)."""
    files = sorted(p for p in folder.glob(glob) if p.is_file())
    for number, path in enumerate(files, 1):
        name = str(path.relative_to(folder))
        yield Row(number, {"id": name, "file": name, "path": str(path.resolve())})
