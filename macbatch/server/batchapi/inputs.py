"""A batch's input file: checked line by line when the batch is created (OpenAI's rules: one
JSON object per line with a unique ``custom_id``, ``method`` POST, the batch's ``url`` and a
``body``), then read as a job of the job runner (``macbatch run``'s OpenAI-batch input), so a
row means what it means there and in ``serve``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from macbatch.batch.inputs import jsonl_rows
from macbatch.batch.job_sections import InputSpec
from macbatch.batch.plan import RESPONSES_URL, plan_job, prepare
from macbatch.batch.pooled import EMBEDDINGS_URL
from macbatch.batch.spec import JobSpec
from macbatch.openai import Endpoint, ImageAccess
from macbatch.server.errors import invalid

ENDPOINTS = (*(e.value for e in Endpoint), RESPONSES_URL, EMBEDDINGS_URL)
SHOWN = 3  # problems named in one refusal


def batch_job(batch_id: str, path: Path) -> JobSpec:
    """The batch as a job: its rows are API bodies (no template, system or job sampling)."""
    return JobSpec(
        name=batch_id,
        index=0,
        input=InputSpec(path, "openai", None),
        prompts=None,
        template=None,
        system=None,
        given_sampling={},
        n=1,
        chat=True,
        score=None,
    )


def check_endpoint(endpoint: object) -> str:
    if endpoint not in ENDPOINTS:
        raise invalid(f"endpoint must be one of {', '.join(ENDPOINTS)}", "endpoint")
    assert isinstance(endpoint, str)
    return endpoint


def count_requests(path: Path, endpoint: str, model: str, images: ImageAccess) -> int:
    """Check every line as the job will read it (a 400 naming the first few bad ones), so each
    row the batch runs has its ``custom_id``; returns the requests the batch will run."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for row in jsonl_rows(path):
        problem = row.problem or _row_problem(row.fields or {}, endpoint, seen, row.line)
        if problem is not None:
            problems.append(f"line {row.line}: {problem}")
    if problems:
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise invalid(
            "the input file is not a valid batch: " + "; ".join(problems[:SHOWN]) + more,
            "input_file_id",
        )
    if not seen:
        raise invalid("the input file has no requests", "input_file_id")
    job = batch_job("check", path)
    return sum(1 for _ in plan_job(job, model, prepare(job), images))


def _row_problem(
    row: dict[str, Any], endpoint: str, seen: dict[str, int], number: int
) -> str | None:
    custom_id = row.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id must be a non-empty string"
    if custom_id in seen:
        return f"custom_id {custom_id!r} repeats line {seen[custom_id]}"
    seen[custom_id] = number
    if row.get("method", "POST") != "POST":
        return "method must be POST"
    if row.get("url") != endpoint:
        return f"url must be the batch's endpoint {endpoint}"
    if not isinstance(row.get("body"), dict):
        return "body must be a JSON object"
    return None
