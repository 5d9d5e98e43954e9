"""Structured output in `macbatch run`: per-job schema and choices, OpenAI-batch rows with their
own response_format and tools, `parsed` in every result line (re-read from disk and checked with
the `jsonschema` library), the summary's count, and bad constraints as errors-file lines."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from tests.support.job_files import JOBS, read_jsonl, shipped_job_on_a_sample, write_job
from tests.support.structured import ADD_TOOL


def test_extract_example_parses_every_reply(tmp_path: Path, tiny_model_path: Path, macbatch_run):
    """`jobs/extract.yaml` with the tiny model standing in for the demo model."""
    job_file, rows = shipped_job_on_a_sample("extract.yaml", tmp_path, every=10)
    out = tmp_path / "out"
    result = macbatch_run(job_file, "--model", tiny_model_path, "-o", out, "--max-seqs", "128")
    assert result.exit_code == 0, result.output
    spec = yaml.safe_load((JOBS / "extract.yaml").read_text())
    schema = spec["jobs"][0]["schema"]
    questions = {q["id"]: q for q in rows}
    extract = read_jsonl(out / "extract.jsonl")
    classify = read_jsonl(out / "classify.jsonl")
    assert len(extract) == len(classify) == len(questions)
    for line in extract:
        content = line["response"]["body"]["choices"][0]["message"]["content"]
        assert line["parsed"] == json.loads(content)
        jsonschema.validate(line["parsed"], schema)
        correct = line["parsed"]["task"] == questions[line["custom_id"]]["task"]
        assert line["macbatch"]["correct"] is correct
    for line in classify:
        assert line["parsed"] in spec["jobs"][1]["choices"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parsed"] == 2 * len(questions)
    assert summary["jobs"]["extract"]["parsed"] == len(questions)


def test_openai_rows_keep_their_response_format_and_tools(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    ask = [{"role": "user", "content": "hello"}]
    call = {"id": "abc123456", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    rows = [
        {
            "custom_id": "schema",
            "body": {
                "messages": ask,
                "max_tokens": 40,
                "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
            },
        },
        {"custom_id": "choice", "body": {"messages": ask, "guided_choice": ["yes", "no"]}},
        {"custom_id": "bad-regex", "body": {"messages": ask, "guided_regex": "(x"}},
        {"custom_id": "bad-tool", "body": {"messages": ask, "tools": [{"function": {}}]}},
        # The tiny model's template has no tool-call format: a forced choice cannot be honoured.
        {
            "custom_id": "forced-tool",
            "body": {"messages": ask, "tools": [ADD_TOOL], "tool_choice": "required"},
        },
        {"custom_id": "plain", "body": {"messages": ask, "max_tokens": 4}},
        {
            "custom_id": "tool-history",
            "body": {
                "messages": [
                    *ask,
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "abc123456", "content": "5"},
                ],
                "tools": [ADD_TOOL],
                "max_tokens": 4,
            },
        },
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        defaults: {{sampling: {{temperature: 0, max_tokens: 16}}}}
        jobs:
          - name: rows
            input: rows.jsonl
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code == 3, result.output  # some requests failed (they are in errors)
    lines = {line["custom_id"]: line for line in read_jsonl(tmp_path / "out" / "rows.jsonl")}
    assert set(lines) == {"schema", "choice", "plain", "tool-history"}
    jsonschema.validate(lines["schema"]["parsed"], schema)
    assert lines["choice"]["parsed"] in ("yes", "no")
    assert "parsed" not in lines["plain"]
    # the call and its result reached the template: the prompt is longer than the question's
    assert (
        lines["tool-history"]["macbatch"]["prompt_tokens"]
        > lines["plain"]["macbatch"]["prompt_tokens"]
    )
    errors = {e["custom_id"]: e for e in read_jsonl(tmp_path / "out" / "rows.errors.jsonl")}
    assert set(errors) == {"bad-regex", "bad-tool", "forced-tool"}
    assert "unclosed group" in errors["bad-regex"]["error"]["message"]
    assert "no tool-call format" in errors["forced-tool"]["error"]["message"]


def test_openai_rows_without_their_own_constraint_follow_the_jobs(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
):
    ask = [{"role": "user", "content": "hello"}]
    rows = [
        {"custom_id": "inherits", "body": {"messages": ask}},
        {"custom_id": "own", "body": {"messages": ask, "guided_choice": ["up", "down"]}},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        defaults: {{sampling: {{temperature: 0, max_tokens: 8}}}}
        jobs:
          - name: rows
            input: rows.jsonl
            choices: ["yes", "no"]
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code == 0, result.output
    lines = {line["custom_id"]: line for line in read_jsonl(tmp_path / "out" / "rows.jsonl")}
    assert lines["inherits"]["parsed"] in ("yes", "no")
    assert lines["own"]["parsed"] in ("up", "down")


def test_bad_schema_in_the_job_file_names_the_line(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
):
    job = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - name: a
            prompts: [hi]
            schema: {{type: objekt}}
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code != 0
    assert "jobs.yaml:5" in result.output and "schema" in result.output
