"""`chat_template_kwargs:` in a job file: defaults and per job, sent to the template, part of the
job's identity for resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.batch.spec import load_job_file
from macbatch.engine import Engine, PromptInput, SamplingParams
from tests.support.job_files import read_jsonl, write_job
from tests.support.tiny import THINKING_TEMPLATE, save_model


@pytest.fixture
def switch_model(tmp_path: Path) -> Path:
    return save_model(tmp_path / "model", chat_template=THINKING_TEMPLATE)


def test_jobs_send_template_kwargs_and_resume_sees_changes(
    tmp_path: Path, switch_model: Path, macbatch_run
) -> None:
    job_file = write_job(
        tmp_path,
        f"""
        model: {switch_model}
        defaults:
          chat_template_kwargs: {{enable_thinking: false}}
          sampling: {{temperature: 0, max_tokens: 4}}
        jobs:
          - name: no-think
            prompts: ["hello world"]
          - name: think
            prompts: ["hello world"]
            chat_template_kwargs: {{enable_thinking: true}}
        """,
    )
    spec = load_job_file(job_file)
    assert [j.chat_template_kwargs for j in spec.jobs] == [
        {"enable_thinking": False},
        {"enable_thinking": True},
    ]
    assert spec.jobs[0].settings()["chat_template_kwargs"] == {"enable_thinking": False}
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output

    engine = Engine.load(str(switch_model))
    messages = [{"role": "user", "content": "hello world"}]
    params = SamplingParams(temperature=0, max_tokens=4)
    for name, thinking in (("no-think", False), ("think", True)):
        [line] = read_jsonl(tmp_path / "out" / f"{name}.jsonl")
        kwargs = {"enable_thinking": thinking}
        [oracle] = engine.generate([PromptInput(messages, kwargs)], params)
        assert line["macbatch"]["prompt_tokens"] == oracle.metrics.prompt_tokens
        assert line["response"]["body"]["choices"][0]["message"]["content"] == oracle.text
    on, off = (engine.encode_prompt(messages, {"enable_thinking": t}) for t in (True, False))
    assert len(off) > len(on)

    job_file.write_text(job_file.read_text().replace("enable_thinking: true", "enable_thinking: 0"))
    refused = macbatch_run(job_file, "--job", "think")
    assert refused.exit_code == 1 and "changed since its last run" in refused.stderr
