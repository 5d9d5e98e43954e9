"""A row the engine's step fails on is that row's error line, and the run finishes (issue 46: one
OpenAI-batch row whose `top_k` raised inside the step stopped the whole run, no good row written,
and every rerun hit it again). The failure is injected into the sampler for the row's seed."""

from __future__ import annotations

import json
from pathlib import Path

import macbatch.engine.worker.model_runner as model_runner
from tests.support.job_files import read_jsonl, write_job

BAD_SEED = 666


def test_a_row_the_step_fails_on_is_its_error_line(
    tmp_path: Path, tiny_model_path: Path, macbatch_run, monkeypatch
) -> None:
    sample = model_runner.sample

    def failing(logits, rows):
        if any(r.params.seed == BAD_SEED for r in rows):
            raise RuntimeError("std::bad_cast")
        return sample(logits, rows)

    monkeypatch.setattr(model_runner, "sample", failing)
    with (tmp_path / "rows.jsonl").open("w") as rows:
        for i in range(8):
            body = {"prompt": f"row {i}", "max_tokens": 4, "temperature": 0, "seed": i}
            if i == 5:
                body["seed"] = BAD_SEED
            line = {"custom_id": f"r{i}", "url": "/v1/completions", "body": body}
            rows.write(json.dumps(line) + "\n")
    write_job(tmp_path, f"model: {tiny_model_path}\njobs: [{{name: rows, input: rows.jsonl}}]\n")
    for _ in range(2):  # the rerun runs only the failed row again, and finishes too
        result = macbatch_run(tmp_path / "jobs.yaml")
        assert result.exit_code == 3, result.output  # a row failed; the run did not
        written = {line["custom_id"] for line in read_jsonl(tmp_path / "out" / "rows.jsonl")}
        assert written == {f"r{i}" for i in range(8) if i != 5}
        [error] = read_jsonl(tmp_path / "out" / "rows.errors.jsonl")
        assert error["custom_id"] == "r5" and error["error"]["code"] == "engine_error"
        assert "std::bad_cast" in error["error"]["message"]
