"""Job files and their inputs written for `macbatch run`, and its output files re-read with the
csv and json modules (not the runner's own readers). Batch tests, and the vision tests that run
image jobs, import these by name, so they live here rather than in a conftest."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path
from typing import Any

import yaml


def write_job(directory: Path, text: str) -> Path:
    """Write a job file (dedented YAML) into `directory`."""
    path = directory / "jobs.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    """A CSV input file of `rows` (its header from the first row's keys)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_table(path: Path) -> list[dict[str, str]]:
    """A job's CSV table, re-read with the csv module."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, checking that each one is complete JSON."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path} ends with a partial line"
    return [json.loads(line) for line in data.splitlines()]


JOBS = Path(__file__).resolve().parents[2] / "jobs"


def shipped_job_on_a_sample(name: str, directory: Path, every: int = 25) -> tuple[Path, list]:
    """jobs/`name` as shipped, but reading every `every`-th row of the demo question set (the
    whole set is 1,000 questions: too many for a random-weight stand-in in every test run).
    Returns the job file and the sampled rows."""
    rows = read_jsonl(JOBS / "data" / "demo_questions.jsonl")[::every]
    sample = directory / "questions.jsonl"
    sample.write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = yaml.safe_load((JOBS / name).read_text())
    for job in spec["jobs"]:
        assert job["input"] == "data/demo_questions.jsonl", job
        job["input"] = str(sample)
    path = directory / name
    path.write_text(yaml.safe_dump(spec))
    return path, rows


def write_system_prompt_job(
    directory: Path, model: Path, system: str, prompts: list[str], max_tokens: int
) -> Path:
    """A job file whose one job, ``ask``, sends ``prompts`` greedily after ``system`` (written
    to ``out/``)."""
    return write_job(
        directory,
        f"""
        version: 1
        model: {model}
        defaults:
          system: {json.dumps(system)}
          sampling: {{temperature: 0, max_tokens: {max_tokens}}}
        output: {{dir: out}}
        jobs:
          - name: ask
            prompts: {json.dumps(prompts)}
        """,
    )
