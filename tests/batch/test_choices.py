"""An OpenAI-batch row whose body asks for ``n`` choices is one result line holding them all, as
serve answers that body and as OpenAI's batch output has it (issue 46: it was n lines with one
choice each, all with the same custom_id). The job's own ``n`` stays samples, a line each."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from openai.types import Completion
from openai.types.chat import ChatCompletion

from macbatch.engine import Engine, SamplingParams
from tests.support.job_files import read_jsonl, write_job

HI = [{"role": "user", "content": "Say something."}]


def test_a_body_with_n_is_one_line_with_its_n_choices(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    rows = [
        {"custom_id": "two", "body": {"messages": HI, "n": 2, "max_tokens": 4, "seed": 7}},
        {"custom_id": "one", "body": {"messages": HI, "max_tokens": 4, "seed": 7}},
        {
            "custom_id": "prompts",  # a completions body: prompts x n choices, in that order
            "url": "/v1/completions",
            "body": {"prompt": ["Once", "Twice"], "n": 2, "max_tokens": 3, "seed": 3},
        },
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job_file = write_job(
        tmp_path, f"model: {tiny_model_path}\njobs: [{{name: j, input: rows.jsonl}}]\n"
    )
    for _ in range(2):  # the rerun finds every line done
        result = macbatch_run(job_file)
        assert result.exit_code == 0, result.output
        lines = read_jsonl(tmp_path / "out" / "j.jsonl")
        assert Counter(line["custom_id"] for line in lines) == {"two": 1, "one": 1, "prompts": 1}
    by_id = {line["custom_id"]: line["response"]["body"] for line in lines}
    two = ChatCompletion.model_validate(by_id["two"])
    one = ChatCompletion.model_validate(by_id["one"])
    prompts = Completion.model_validate(by_id["prompts"])
    assert [c.index for c in two.choices] == [0, 1] and len(one.choices) == 1
    assert [c.index for c in prompts.choices] == [0, 1, 2, 3]

    engine = Engine.load(str(tiny_model_path))  # the oracle: each choice alone, seed + i

    def alone(prompt: object, seed: int, max_tokens: int) -> str:
        params = SamplingParams(max_tokens=max_tokens, seed=seed, temperature=1.0)
        return engine.generate([prompt], params)[0].text

    assert [c.message.content for c in two.choices] == [alone(HI, 7, 4), alone(HI, 8, 4)]
    assert one.choices[0].message.content == two.choices[0].message.content
    expected = [alone(p, seed, 3) for p in ("Once", "Twice") for seed in (3, 4)]
    assert [c.text for c in prompts.choices] == expected
    assert two.usage is not None and one.usage is not None
    assert two.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt once, as serve counts


def test_the_jobs_n_is_samples_a_line_each(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    job_file = write_job(
        tmp_path,
        f"model: {tiny_model_path}\njobs: [{{name: j, prompts: [hi], n: 3, "
        "sampling: {max_tokens: 2}}]\n",
    )
    assert macbatch_run(job_file).exit_code == 0
    lines = read_jsonl(tmp_path / "out" / "j.jsonl")
    assert sorted(line["macbatch"]["sample"] for line in lines) == [0, 1, 2]
    assert all(len(line["response"]["body"]["choices"]) == 1 for line in lines)
