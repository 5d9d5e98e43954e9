"""Job file validation: every mistake gives file:line:column and a way to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.batch.spec import load_job_file
from macbatch.batch.templates import template_fields
from macbatch.batch.yamlfile import JobFileError
from macbatch.engine import DEFAULT_SPECULATIVE_TOKENS, EngineConfig
from tests.support.job_files import write_job


def error_for(tmp_path: Path, text: str) -> str:
    path = write_job(tmp_path, text)
    with pytest.raises(JobFileError) as caught:
        load_job_file(path)
    return str(caught.value)


def test_valid_file_merges_defaults_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "articles.csv").write_text("article_id,text\n1,a\n")
    path = write_job(
        tmp_path,
        """
        version: 1
        model: mlx-community/Qwen3-0.6B-4bit
        defaults:
          system: "You are concise."
          sampling: {temperature: 0.7, top_p: 0.95, max_tokens: 512, seed: 0, stop: []}
        output: {dir: out/}
        jobs:
          - name: summarize
            input: {path: data/articles.csv, id: "{article_id}"}
            template: "Summarize:\\n\\n{text}"
            n: 2
          - name: questions
            prompts: ["What is MLX?", {id: q2, messages: [{role: user, content: "..."}]}]
            sampling: {temperature: 0}
        """,
    )
    spec = load_job_file(path)
    assert spec.model == "mlx-community/Qwen3-0.6B-4bit"
    assert spec.output_dir == tmp_path / "out/"
    summarize, questions = spec.jobs
    assert summarize.input is not None and summarize.input.format == "csv"
    assert summarize.input.path == tmp_path / "data" / "articles.csv"
    assert summarize.n == 2 and summarize.system == "You are concise."
    assert summarize.template == "Summarize:\n\n{text}"
    assert summarize.sampling == {
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 512,
        "seed": 0,
        "stop": [],
    }
    assert questions.sampling["temperature"] == 0 and questions.sampling["top_p"] == 0.95
    assert questions.prompts == (
        "What is MLX?",
        {"id": "q2", "messages": [{"role": "user", "content": "..."}]},
    )


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    message = error_for(
        tmp_path,
        """
        model: demo
        jobs:
          - name: a
            prompts: [hi]
          - name: b
            prompts: [hi]
            sampling: {temprature: 0}
        """,
    )
    assert message == (
        f"{tmp_path / 'jobs.yaml'}:7:16: unknown key 'temprature' in jobs[1].sampling; "
        "did you mean 'temperature'?"
    )


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path: Path) -> None:
    message = error_for(tmp_path, "model: demo\nzzz: 1\njobs: [{name: a, prompts: [hi]}]\n")
    assert message.endswith(
        ":2:1: unknown key 'zzz' in the top level (valid keys: version, model, kv_bits, "
        "indexer_keys, speculative, defaults, output, jobs)"
    )


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    message = error_for(tmp_path, "model: demo\njobs: [{name: a, prompts: [hi]}\nx: 1\n")
    assert message.startswith(f"{tmp_path / 'jobs.yaml'}:3:1: YAML syntax error: ")


@pytest.mark.parametrize(
    ("value", "tag"), [("!shout hi", "!shout"), ("!!python/name:os.system hi", "python/name")]
)
def test_an_unknown_yaml_tag_has_line_and_column(
    tmp_path: Path, macbatch_run, value: str, tag: str
) -> None:
    """A tag no safe loader constructs is the file's error at its place, never a stopped run."""
    path = write_job(tmp_path, f"model: demo\njobs:\n  - name: a\n    prompts: [{value}]\n")
    message = error_for(tmp_path, path.read_text())
    assert message.startswith(f"{path}:4:15: YAML value error: ") and tag in message
    result = macbatch_run(path)
    assert result.exit_code == 1 and f"{path}:4:15: YAML value error" in result.output
    assert "the run stopped" not in result.output


def test_job_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match="job file not found: .*nope.yaml"):
        load_job_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the job file is empty"),
        ("jobs: [{name: a, prompts: [hi]}]", ":1:8: missing 'model': job 'a' names none"),
        (
            "jobs: [{name: a, model: demo, prompts: [hi]}, {name: b, prompts: [hi]}]",
            ":1:47: missing 'model': job 'b' names none",
        ),
        (
            "model: demo\njobs: [{name: a, model: 3, prompts: [hi]}]",
            ":2:18: jobs[0].model must be a non-empty string",
        ),
        ("model: demo", ":1:1: missing 'jobs'"),
        ("model: demo\njobs: []", ":2:1: 'jobs' must be a non-empty list of jobs"),
        ("model: demo\nversion: 2\njobs: [{name: a, prompts: [hi]}]", ":2:1: unsupported version"),
        ("model: demo\njobs: [{prompts: [hi]}]", ":2:8: jobs[0] has no 'name'"),
        (
            "model: demo\njobs:\n- {name: a, prompts: [x]}\n- {name: a, prompts: [y]}",
            ":4:4: duplicate job name 'a' (also jobs[0])",
        ),
        ("model: demo\njobs: [{name: a, prompts: []}]", ":2:18: jobs[0].prompts is empty"),
        ("model: demo\njobs: [{name: a}]", "job 'a' needs exactly one of 'input' (a file)"),
        (
            "model: demo\njobs: [{name: ../x, prompts: [hi]}]",
            "job name '../x' must work as a file name (<name>.jsonl)",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], sampling: {temperature: -1}}]",
            ":2:44: jobs[0].sampling: invalid sampling parameter temperature=-1: must be a "
            "number in [0, 2]",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], sampling: {temperature: 2.5}}]",
            ":2:44: jobs[0].sampling: invalid sampling parameter temperature=2.5: must be a "
            "number in [0, 2] (0 means greedy)",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], sampling: {max_tokens: 0}}]",
            "invalid sampling parameter max_tokens=0: must be an integer in [1, 2147483647]",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], n: 0}]",
            "jobs[0].n must be an integer >= 1",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [{id: x}]}]",
            "jobs[0].prompts[0] needs exactly one of 'prompt' or 'messages'",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [{prompt: hi, expected: x}]}]",
            "unknown key 'expected' in jobs[0].prompts[0]",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [{messages: [{role: user}]}]}]",
            "messages[0].content must be a string",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], template: '{x}'}]",
            "'template' applies to rows of an input file",
        ),
        (
            "model: demo\njobs: [{name: a, input: nope.csv}]",
            ":2:18: input file not found: ",
        ),
        (
            "model: demo\njobs: [{name: a, input: data.txt}]",
            "cannot tell the format of 'data.txt' from its extension; add format:",
        ),
        (
            "model: demo\njobs: [{name: a, input: {path: d.csv, format: cvs}}]",
            "unknown input format 'cvs'; did you mean 'csv'?",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], score: {group: task}}]",
            "jobs[0].score needs 'field'",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], chat_template_kwargs: {tokenize: 1}}]",
            ":2:33: jobs[0].chat_template_kwargs: 'tokenize' is an argument of apply_chat_template",
        ),
        (
            "model: demo\ndefaults: {chat_template_kwargs: [x]}\njobs: [{name: a, prompts: [hi]}]",
            ":2:12: defaults.chat_template_kwargs: chat_template_kwargs must be a mapping",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [hi], chat: false,"
            " chat_template_kwargs: {x: 1}}]",
            "chat_template_kwargs needs the chat template; chat is false",
        ),
        (
            "model: demo\njobs: [{name: a, prompts: [{prompt: hi, x: y}],"
            " score: {field: x, parsed: label}}]",
            "jobs[0].score.parsed scores a field of the reply's JSON, but nothing makes "
            "job 'a' reply in JSON: give it a 'schema'",
        ),
        (
            "model: demo\ndefaults: {score: {field: x, parsed: label}}\n"
            "jobs: [{name: a, prompts: [{prompt: hi, x: y}], choices: [good, bad]}]",
            ":2:30: defaults.score.parsed scores a field of the reply's JSON",
        ),
        (
            "model: demo\nkv_bits: 16\njobs: [{name: a, prompts: [hi]}]",
            ":2:1: kv_bits must be 8, 4 or None (float pages), got 16",
        ),
    ],
)
def test_bad_job_files(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_for(tmp_path, text)


def test_template_must_name_plain_fields() -> None:
    assert template_fields("Q: {question}\nA: {{literal}} {task}") == ["question", "task"]
    for bad, reason in [
        ("{a.b}", "must be a plain field name"),
        ("{}", "empty field {}"),
        ("{x!r}", "must be a plain field name"),
        ("{unclosed", "write a literal brace as {{ or }}"),
    ]:
        with pytest.raises(ValueError) as caught:
            template_fields(bad)
        assert reason in str(caught.value)


def test_bad_template_in_file_points_at_it(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("a\n1\n")
    message = error_for(
        tmp_path, "model: demo\njobs:\n  - name: a\n    input: d.csv\n    template: 'x {a.b}'\n"
    )
    assert ":5:5: jobs[0].template: template field {a.b} must be a plain field name" in message


def test_model_path_is_relative_to_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    path = write_job(tmp_path, "model: models/tiny\njobs: [{name: a, prompts: [hi]}]\n")
    assert load_job_file(path).model == str((tmp_path / "models" / "tiny").resolve())
    assert load_job_file(path, model_override="demo").model == "demo"


def test_parsed_scores_are_allowed_where_rows_may_ask_for_json(tmp_path: Path) -> None:
    """An OpenAI-batch file's rows carry their own response_format, so a JSON-lines input may
    score a parsed field with no constraint on the job; a CSV cannot."""
    (tmp_path / "rows.jsonl").write_text("{}\n")
    (tmp_path / "rows.csv").write_text("x\n1\n")
    job = "model: demo\njobs: [{name: a, input: rows.%s, score: {field: x, parsed: label}}]"
    spec = load_job_file(write_job(tmp_path, job % "jsonl"))
    assert spec.jobs[0].score.parsed == "label"
    assert "nothing makes job 'a' reply in JSON" in error_for(tmp_path, job % "csv")


JOBS = "jobs: [{name: a, prompts: [hi]}]\n"


def test_speculative_settings_become_engine_fields(tmp_path: Path) -> None:
    (tmp_path / "draft").mkdir()
    path = tmp_path / "jobs.yaml"
    path.write_text("model: demo\nspeculative: {draft_model: draft, num_tokens: 3}\n" + JOBS)
    assert load_job_file(path).speculative == {
        "speculative": "draft",
        "draft_model": str(tmp_path / "draft"),
        "num_speculative_tokens": 3,
    }
    path.write_text("model: demo\nspeculative: {}\n" + JOBS)
    fields = load_job_file(path).speculative
    assert fields == {"speculative": "ngram", "draft_model": None, "num_speculative_tokens": None}
    assert EngineConfig(**fields).draft_length == DEFAULT_SPECULATIVE_TOKENS["ngram"]
    bad = error_for(tmp_path, "model: demo\nspeculative: {method: draft}\n" + JOBS)
    assert "method draft needs one" in bad
    bad = error_for(tmp_path, "model: demo\nspeculative: {num_tokens: 99}\n" + JOBS)
    assert "num_speculative_tokens must be an integer in [1, 16]" in bad
