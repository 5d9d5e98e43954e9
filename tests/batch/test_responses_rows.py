"""``macbatch run`` over OpenAI-batch rows for /v1/responses: a Responses body means the chat
body it converts to, so its reply equals the chat row's (greedy) and mlx-lm's own generation of
the same rendered prompt; the job's sampling sits under the body; a rerun skips them all; a row
that continues a stored response is refused."""

from __future__ import annotations

import json
from pathlib import Path

import mlx_lm
from mlx_lm.sample_utils import make_sampler

from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.spec import load_job_file
from tests.support.job_files import read_jsonl, write_job

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "the quick brown fox"},
]
RESPONSES = {"instructions": "Answer briefly.", "input": "the quick brown fox", "temperature": 0}
ROWS = [
    {"custom_id": "chat", "url": "/v1/chat/completions",
     "body": {"messages": MESSAGES, "temperature": 0}},
    {"custom_id": "resp", "url": "/v1/responses", "body": RESPONSES},
    {"custom_id": "own", "url": "/v1/responses", "body": {**RESPONSES, "max_output_tokens": 2}},
    {"custom_id": "continues", "url": "/v1/responses",
     "body": {"input": "x", "previous_response_id": "resp_1"}},
    {"custom_id": "bad", "url": "/v1/responses", "body": {"input": [{"type": "nope"}]}},
]  # fmt: skip
JOB = """
model: {model}
jobs:
  - name: mixed
    input: {{path: batch.jsonl, format: openai}}
    sampling: {{max_tokens: 5}}
"""


def _job(tmp_path: Path, model: Path) -> Path:
    (tmp_path / "batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return write_job(tmp_path, JOB.format(model=model))


def test_responses_rows_equal_chat_rows(tmp_path: Path, tiny_model_path: Path, macbatch_run):
    job_file = _job(tmp_path, tiny_model_path)
    result = macbatch_run(job_file)
    assert result.exit_code == 3, result.output  # two rows failed
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "mixed.jsonl")}
    assert sorted(lines) == ["chat", "own", "resp"]
    chat = lines["chat"]["response"]["body"]
    resp, own = (lines[k]["response"]["body"] for k in ("resp", "own"))
    [message] = [item for item in resp["output"] if item["type"] == "message"]
    assert message["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert resp["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert resp["usage"]["output_tokens"] == chat["usage"]["completion_tokens"] <= 5
    assert resp["id"] == f"resp_{lines['resp']['macbatch']['key']}" and resp["store"] is False
    assert resp["instructions"] == "Answer briefly." and own["max_output_tokens"] == 2
    assert own["usage"]["output_tokens"] <= 2
    model, tokenizer = mlx_lm.load(str(tiny_model_path))
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    expected = mlx_lm.generate(
        model, tokenizer, prompt, max_tokens=5, sampler=make_sampler(temp=0.0)
    )
    assert message["content"][0]["text"] == expected
    errors = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "mixed.errors.jsonl")}
    assert sorted(errors) == ["bad", "continues"]
    assert "previous_response_id" in errors["continues"]["error"]["message"]
    again = macbatch_run(job_file)
    assert again.exit_code == 3 and len(read_jsonl(tmp_path / "out" / "mixed.jsonl")) == 3


def test_a_responses_rows_key_covers_its_fields(tmp_path: Path) -> None:
    job_file = load_job_file(_job(tmp_path, Path("demo")))
    job = job_file.jobs[0]
    items = list(plan_job(job, job_file.model, prepare(job)))
    chat, resp, own, continues, bad = items
    assert isinstance(resp, Planned) and isinstance(own, Planned)
    assert resp.responses is not None and resp.generation is not None
    assert resp.generation.params.max_tokens == 5 and own.generation is not None
    assert own.generation.params.max_tokens == 2 and resp.key != own.key != chat.key
    assert isinstance(continues, Rejected) and isinstance(bad, Rejected)
