"""Helpers for the batch runner tests: write job files, run `macbatch run` in-process, re-read."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

from macbatch.batch.command import run_command


@pytest.fixture(scope="session")
def run_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(run_command)
    return app


@pytest.fixture
def macbatch_run(run_app: typer.Typer):
    """Call `macbatch run ARGS...` in-process; returns click's Result (stdout, stderr, code)."""

    def invoke(*args: Any) -> Result:
        return CliRunner().invoke(run_app, [str(a) for a in args])

    return invoke


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


def chat_prompt_tokens(model: Path, system: str, prompts: list[str]) -> list[list[int]]:
    """The oracle for each row's prompt: Hugging Face's tokenizer and chat template for the
    model, the system message and one user message."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": text}],
                tokenize=False,
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )
        for text in prompts
    ]


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt shares."""
    shared = 0
    while all(len(p) > shared and p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    return shared
