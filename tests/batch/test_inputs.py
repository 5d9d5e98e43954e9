"""Input files and request planning, without a model: rows, line numbers, header checks, ids,
prompts, sampling per request, and lazy reading."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.spec import load_job_file
from macbatch.batch.yamlfile import JobFileError
from tests.support.job_files import write_job


def planned(tmp_path: Path, job_yaml: str) -> list[Planned | Rejected]:
    spec = load_job_file(write_job(tmp_path, "model: demo\njobs:\n" + job_yaml))
    job = spec.jobs[0]
    return list(plan_job(job, spec.model, prepare(job)))


def prepare_error(tmp_path: Path, job_yaml: str) -> str:
    spec = load_job_file(write_job(tmp_path, "model: demo\njobs:\n" + job_yaml))
    with pytest.raises(JobFileError) as caught:
        prepare(spec.jobs[0])
    return str(caught.value)


def test_csv_rows_keep_their_line_numbers(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text(
        'id,text\nr1,"two\nlines"\n\nr2,plain\nr3,too,many\nr4,last\n', newline=""
    )
    items = planned(
        tmp_path,
        "  - {name: a, input: d.csv, template: 'T: {text}', system: S,"
        " sampling: {temperature: 0}}\n",
    )
    assert [(type(i).__name__, i.line, i.custom_id) for i in items] == [
        ("Planned", 2, "r1"),
        ("Planned", 5, "r2"),
        ("Rejected", 6, None),
        ("Planned", 7, "r4"),
    ]
    assert items[0].prompt == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "T: two\nlines"},
    ]
    assert items[2].reason == "has 3 fields but the header has 2"


def test_jsonl_bad_lines_are_rejected_and_the_rest_continue(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_bytes(
        b'{"q": "one"}\n{"q": broken\n[1, 2]\n\n\xff\xfe\n{"x": 1}\n{"q": "two", "id": 7}\n'
    )
    items = planned(tmp_path, "  - {name: a, input: d.jsonl, template: '{q}'}\n")
    summary = [
        (i.line, i.custom_id, i.reason if isinstance(i, Rejected) else i.prompt[-1]["content"])
        for i in items
    ]
    assert summary == [
        (1, "1", "one"),
        (2, None, "invalid JSON: Expecting value at column 7"),
        (3, None, "expected a JSON object, got list"),
        (5, None, "not UTF-8 text: invalid start byte at byte 0"),
        (6, "6", "row has no field 'q' (named by the template)"),
        (7, "7", "two"),
    ]


def test_header_checks_name_the_missing_field(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("article_id,text\n1,a\n")
    message = prepare_error(tmp_path, "  - {name: a, input: d.csv, template: '{txt}'}\n")
    assert (
        message
        == "job 'a': d.csv: template names field 'txt', which rows lack; did you mean 'text'?"
    )
    message = prepare_error(
        tmp_path, "  - {name: a, input: {path: d.csv, id: '{articleid}'}, template: '{text}'}\n"
    )
    assert (
        "input.id names field 'articleid', which rows lack; did you mean 'article_id'?" in message
    )
    message = prepare_error(
        tmp_path, "  - {name: a, input: d.csv, template: '{text}', score: {field: answer}}\n"
    )
    assert (
        "score.field names field 'answer', which rows lack (valid fields: article_id, text)"
        in message
    )
    message = prepare_error(tmp_path, "  - {name: a, input: d.csv}\n")
    assert "d.csv has no 'prompt' or 'messages' field and the job has no template" in message


def test_empty_and_unusable_inputs(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("")
    assert "d.csv is empty; a csv input needs a header line" in prepare_error(
        tmp_path, "  - {name: a, input: d.csv, template: x}\n"
    )
    (tmp_path / "d.jsonl").write_text("not json\n")
    assert "has no valid JSON object on any line" in prepare_error(
        tmp_path, "  - {name: a, input: d.jsonl, template: x}\n"
    )
    (tmp_path / "e.csv").write_text("a,a\n1,2\n")
    assert "duplicate column names: a" in prepare_error(
        tmp_path, "  - {name: a, input: e.csv, template: x}\n"
    )
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    assert "is not an OpenAI batch request" in prepare_error(
        tmp_path, "  - {name: a, input: {path: p.jsonl, format: openai}}\n"
    )


def test_openai_batch_rows(tmp_path: Path) -> None:
    rows = [
        {
            "custom_id": "c1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "ignored",
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 5,
                "temperature": 0,
                "stop": "x",
            },
        },
        {"custom_id": "c2", "url": "/v1/completions", "body": {"prompt": "raw", "top_p": 0.5}},
        {"custom_id": "c3", "url": "/v1/moderations", "body": {"input": "x"}},
        {"custom_id": "c4", "body": {"messages": [], "temperature": 0}},
        {"custom_id": "c5", "body": {"messages": [{"role": "user", "content": "x"}], "top_p": 2}},
    ]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = planned(tmp_path, "  - {name: a, input: b.jsonl, system: ignored}\n")
    first, second, third, fourth, fifth = items
    assert first.custom_id == "c1" and first.prompt == rows[0]["body"]["messages"]
    assert first.sampling == {"temperature": 0, "max_tokens": 5, "stop": ["x"]}
    assert second.prompt == "raw" and second.sampling["top_p"] == 0.5
    assert isinstance(third, Rejected) and "unsupported url '/v1/moderations'" in third.reason
    assert isinstance(fourth, Rejected) and "'messages' must be a non-empty list" in fourth.reason
    assert isinstance(fifth, Rejected) and "top_p=2" in fifth.reason


def test_samples_get_their_own_seed_and_key(tmp_path: Path) -> None:
    items = planned(
        tmp_path,
        "  - {name: a, prompts: [hi, {id: k, prompt: yo}], n: 3, chat: false,"
        " sampling: {seed: 10}}\n",
    )
    assert [(i.custom_id, i.sample, i.sampling["seed"], i.prompt) for i in items] == [
        ("1", 0, 10, "hi"),
        ("1", 1, 11, "hi"),
        ("1", 2, 12, "hi"),
        ("k", 0, 10, "yo"),
        ("k", 1, 11, "yo"),
        ("k", 2, 12, "yo"),
    ]
    assert len({i.key for i in items}) == 6


def test_rows_are_read_lazily(tmp_path: Path) -> None:
    """Planning a 10 MB input holds one row at a time, not the file."""
    text = "x" * 2000
    with (tmp_path / "big.jsonl").open("w") as f:
        for i in range(5_000):
            f.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")
    spec = load_job_file(
        write_job(tmp_path, "model: demo\njobs: [{name: a, input: big.jsonl, template: '{text}'}]")
    )
    job = spec.jobs[0]
    tracemalloc.start()
    count = sum(1 for _ in plan_job(job, spec.model, prepare(job)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 5_000
    assert peak < 1_000_000, f"planning peaked at {peak} bytes for a 10 MB file"


def test_openai_rows_are_refused_as_serve_refuses_them(tmp_path: Path) -> None:
    """The one request layer: what serve answers with a 400, run writes as an error line."""
    hi = [{"role": "user", "content": "hi"}]
    rows = [
        {"custom_id": "a", "body": {"messages": [{"role": "wizard", "content": "x"}]}},
        {"custom_id": "b", "body": {"messages": hi, "logit_bias": {"1": 5}}},
        {"custom_id": "c", "body": {"messages": hi, "temperature": True}},
        {"custom_id": "d", "url": "/v1/completions", "body": {"messages": hi}},
        {"custom_id": "e", "body": {"messages": hi, "n": 2, "top_k": -1}},
    ]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = planned(tmp_path, "  - {name: a, input: b.jsonl}\n")
    wizard, bias, boolean, misplaced, two = items
    assert "messages[0].role must be one of" in wizard.reason
    assert "'logit_bias' is not supported" in bias.reason
    assert "'temperature' must be a number, got True" in boolean.reason
    assert "/v1/completions takes 'prompt', not 'messages'" in misplaced.reason
    assert (two.sample, two.generation.n, two.generation.params.top_k) == (0, 2, 0)
    assert two.generation.params.temperature == 1.0  # the API's default
