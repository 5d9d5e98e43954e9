"""Numbers past what the engine holds, in `macbatch run` (issue 46). One OpenAI-batch row with
``top_k: 2**64`` once reached MLX inside the engine's step: the whole run stopped with no good
row written, and every rerun hit it again. Now it is that row's error line and the run
finishes; in a job's `sampling:` it is refused when the file loads, before the model does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.batch.spec import load_job_file
from macbatch.batch.yamlfile import JobFileError
from tests.support.job_files import read_jsonl, write_job

HUGE = 2**64
BAD_LINE = 8


def _openai_rows(path: Path) -> list[str]:
    """20 chat requests, sampled (temperature 1); the one on BAD_LINE asks for top_k 2**64."""
    ids = []
    with path.open("w") as rows:
        for line in range(1, 21):
            body = {"messages": [{"role": "user", "content": f"row {line}"}], "max_tokens": 2}
            body["temperature"] = 1.0
            if line == BAD_LINE:
                body["top_k"] = HUGE
            else:
                ids.append(f"r{line}")
            request = {"custom_id": f"r{line}", "url": "/v1/chat/completions", "body": body}
            rows.write(json.dumps(request) + "\n")
    return ids


def test_a_row_out_of_range_is_its_error_line_and_the_run_finishes(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    good = _openai_rows(tmp_path / "rows.jsonl")
    write_job(tmp_path, f"model: {tiny_model_path}\njobs: [{{name: rows, input: rows.jsonl}}]\n")
    for _ in range(2):  # the rerun finishes too, and repeats nothing
        result = macbatch_run(tmp_path / "jobs.yaml")
        assert result.exit_code == 3, result.output  # a request failed; the run did not
        assert "the run stopped" not in result.output
        written = [line["custom_id"] for line in read_jsonl(tmp_path / "out" / "rows.jsonl")]
        assert sorted(written) == sorted(good)
        errors = read_jsonl(tmp_path / "out" / "rows.errors.jsonl")
        assert {(e["custom_id"], e["macbatch"]["line"]) for e in errors} == {("r8", BAD_LINE)}
        assert "top_k=18446744073709551616" in errors[0]["error"]["message"]


@pytest.mark.parametrize(
    "field",
    ["top_k: 18446744073709551616", "seed: 18446744073709551616", "max_tokens: 2147483648",
     "stop_token_ids: [18446744073709551616]", "thinking_token_budget: 18446744073709551616"],
)  # fmt: skip
def test_a_sampling_value_out_of_range_is_refused_when_the_file_loads(
    tmp_path: Path, field: str
) -> None:
    path = write_job(
        tmp_path, f"model: demo\njobs:\n  - name: a\n    prompts: [hi]\n    sampling: {{{field}}}\n"
    )
    with pytest.raises(JobFileError) as refused:
        load_job_file(path)
    name = field.split(":")[0]
    assert str(refused.value).startswith(
        f"{path}:5:16: jobs[0].sampling: invalid sampling parameter {name}="
    )


def test_run_refuses_the_file_before_the_model_loads(tmp_path: Path, macbatch_run) -> None:
    sampling = f"sampling: {{top_k: {HUGE}}}"
    write_job(tmp_path, f"model: /no/such/model\njobs: [{{name: a, prompts: [hi], {sampling}}}]\n")
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 1
    assert "jobs[0].sampling: " in result.output and "top_k" in result.output
    assert "cannot load model" not in result.output


@pytest.mark.parametrize("where", ["job", "defaults"])
def test_a_seed_with_no_room_for_its_samples_is_refused_when_the_file_loads(
    tmp_path: Path, where: str
) -> None:
    """Sample i of a row samples with seed + i: a seed near 2**63 with n: 3 overflows the seeds'
    range on its third sample, so the file is refused at the seed, not after the model loads."""
    seed = 2**63 - 2  # seed + 1 fits, seed + 2 does not
    sampling = f"sampling: {{seed: {seed}}}"
    if where == "job":
        text = f"model: demo\njobs:\n  - name: a\n    prompts: [hi]\n    n: 3\n    {sampling}\n"
        at, line, column = "jobs[0].sampling.seed", 6, 16
    else:
        defaults = f"defaults: {{n: 3, {sampling}}}"
        text = f"model: demo\n{defaults}\njobs:\n  - {{name: a, prompts: [hi]}}\n"
        at, line, column = "defaults.sampling.seed", 2, 29
    path = write_job(tmp_path, text)
    with pytest.raises(JobFileError) as refused:
        load_job_file(path)
    assert str(refused.value).startswith(f"{path}:{line}:{column}: {at} with n: 3: ")
    assert "leave room for 3" in str(refused.value)
    path.write_text(text.replace("n: 3", "n: 2"))  # seed + 1 fits
    assert load_job_file(path).jobs[0].n == 2
