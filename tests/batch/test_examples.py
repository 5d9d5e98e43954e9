"""The example job files in jobs/ stay valid, and the README's first command runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from macbatch.batch.ledger import Ledger
from macbatch.batch.plan import prepare
from macbatch.batch.spec import load_job_file
from macbatch.batch.survey import survey_job
from tests.support.job_files import JOBS, read_jsonl, shipped_job_on_a_sample


@pytest.mark.parametrize("path", sorted(JOBS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_job_files_validate(path: Path, tmp_path: Path) -> None:
    spec = load_job_file(path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for job in spec.jobs:
        survey = survey_job(job, prepare(job), ledger)
        assert survey.requests > 0 and survey.rejected == 0


@pytest.mark.parametrize("name", ["demo.yaml", "demo-sampled.yaml"])
def test_demo_jobs_run_and_score(
    name: str, tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    """`macbatch run jobs/demo.yaml` (and the sampled variant) with the tiny model standing in
    for the demo model, on a sample of the questions; result lines re-read and re-scored."""
    job_file, questions = shipped_job_on_a_sample(name, tmp_path)
    out = tmp_path / "out"
    result = macbatch_run(job_file, "--model", tiny_model_path, "-o", out, "--max-seqs", "128")
    assert result.exit_code == 0, result.output
    expected = {q["id"]: q for q in questions}
    summary = json.loads((out / "summary.json").read_text())["jobs"]
    jobs = [job["name"] for job in yaml.safe_load(job_file.read_text())["jobs"]]
    assert set(summary) == set(jobs)
    for job in jobs:
        lines = read_jsonl(out / f"{job}.jsonl")
        assert sorted(x["custom_id"] for x in lines) == sorted(expected)
        for line in lines:
            meta, question = line["macbatch"], expected[line["custom_id"]]
            content = line["response"]["body"]["choices"][0]["message"]["content"]
            assert meta["correct"] == (content.strip() == question["expected"].strip())
            assert meta["group"] == question["task"]
        accuracy = summary[job]["accuracy"]
        assert accuracy["scored"] == len(questions)
        assert set(accuracy["groups"]) == {q["task"] for q in questions}
