"""The example job files in jobs/ stay valid, and the README's first command runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.batch.ledger import Ledger
from macbatch.batch.plan import prepare
from macbatch.batch.spec import load_job_file
from macbatch.batch.survey import survey_job
from tests.batch.conftest import read_jsonl

JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.mark.parametrize("path", sorted(JOBS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_job_files_validate(path: Path, tmp_path: Path) -> None:
    spec = load_job_file(path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for job in spec.jobs:
        survey = survey_job(job, spec.model, prepare(job), ledger)
        assert survey.requests > 0 and survey.rejected == 0


def test_demo_job_runs_and_scores(tmp_path: Path, tiny_model_path: Path, macbatch_run) -> None:
    """`macbatch run jobs/demo.yaml` with the tiny model standing in for the demo model."""
    result = macbatch_run(
        JOBS / "demo.yaml", "--model", tiny_model_path, "-o", tmp_path, "--max-seqs", "128"
    )
    assert result.exit_code == 0, result.output
    questions = read_jsonl(JOBS / "data" / "demo_questions.jsonl")
    lines = read_jsonl(tmp_path / "demo.jsonl")
    assert sorted(x["custom_id"] for x in lines) == sorted(q["id"] for q in questions)
    expected = {q["id"]: q for q in questions}
    for line in lines:
        meta, question = line["macbatch"], expected[line["custom_id"]]
        content = line["response"]["body"]["choices"][0]["message"]["content"]
        assert meta["correct"] == (content.strip() == question["expected"].strip())
        assert meta["group"] == question["task"]
    accuracy = json.loads((tmp_path / "summary.json").read_text())["jobs"]["demo"]["accuracy"]
    assert accuracy["scored"] == len(questions)
    assert set(accuracy["groups"]) == {q["task"] for q in questions}
