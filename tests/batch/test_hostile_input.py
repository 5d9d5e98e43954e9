"""Bad rows and bad job files, as a careless or hostile user writes them (issue 32): one bad row
is that row's error line, never the run's end; a job file that would loop on itself, expand
without bound or plan forever is refused before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.batch.paths import LOCK_NAME
from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.spec import load_job_file
from tests.support.hostile import ref_chain_schema, rule_chain_grammar
from tests.support.job_files import read_jsonl, write_job

DEEP = 5_000


def _rows_file(path: Path) -> None:
    """Five rows: good, a lone surrogate, good, nested 5,000 deep, good (lines 1-5)."""
    lines = [
        json.dumps({"id": "a", "prompt": "hello"}),
        json.dumps({"id": "b", "prompt": "bad \ud800 text"}),  # json.dumps escapes it: valid JSON
        json.dumps({"id": "c", "prompt": "world"}),
        '{"id": "deep", "prompt": ' + "[" * DEEP + "]" * DEEP + "}",
        json.dumps({"id": "e", "prompt": "last"}),
    ]
    path.write_text("\n".join(lines) + "\n")


def test_bad_rows_land_in_errors_and_every_other_row_completes(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    _rows_file(tmp_path / "rows.jsonl")
    write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        defaults: {{sampling: {{max_tokens: 2, temperature: 0}}}}
        jobs:
          - name: rows
            input: rows.jsonl
          - name: inline
            prompts: ["fine", "bad \\ud800 one", "also fine"]
        """,
    )
    for _ in range(2):  # and the rerun neither fails nor repeats anything
        result = macbatch_run(tmp_path / "jobs.yaml")
        assert result.exit_code == 3, result.output  # some requests failed; the run did not
        assert "the run stopped" not in result.output
        out = tmp_path / "out"
        assert sorted(line["custom_id"] for line in read_jsonl(out / "rows.jsonl")) == [
            "a",
            "c",
            "e",
        ]
        assert [line["custom_id"] for line in read_jsonl(out / "inline.jsonl")] == ["1", "3"]
        errors = {
            (line["macbatch"]["job"], line["macbatch"]["line"]): line["error"]["message"]
            for name in ("rows", "inline")
            for line in read_jsonl(out / f"{name}.errors.jsonl")
        }
        assert set(errors) == {("rows", 2), ("rows", 4), ("inline", 2)}
        assert "lone UTF-16 surrogate" in errors["rows", 2]
        assert "lone UTF-16 surrogate" in errors["inline", 2]
        assert "nests more than 100" in errors["rows", 4]


def test_every_error_a_row_causes_is_that_rows(tmp_path: Path, monkeypatch) -> None:
    """Whatever a row makes the planner raise (here a RecursionError from deep inside) becomes a
    rejected row with its line number; the rows after it are still planned."""
    (tmp_path / "d.jsonl").write_text(
        "".join(json.dumps({"prompt": q}) + "\n" for q in ("one", "two", "three"))
    )
    spec = load_job_file(write_job(tmp_path, "model: demo\njobs: [{name: a, input: d.jsonl}]\n"))
    import macbatch.batch.plan as plan

    real = plan._request

    def fragile(job, source, fields, *rest):
        if fields.get("prompt") == "two":
            raise RecursionError("maximum recursion depth exceeded")
        return real(job, source, fields, *rest)

    monkeypatch.setattr(plan, "_request", fragile)
    items = list(plan_job(spec.jobs[0], spec.model, prepare(spec.jobs[0])))
    assert [(type(i).__name__, i.line) for i in items] == [
        ("Planned", 1),
        ("Rejected", 2),
        ("Planned", 3),
    ]
    rejected = items[1]
    assert isinstance(rejected, Rejected) and "RecursionError" in rejected.reason
    assert isinstance(items[0], Planned)


def test_a_surrogate_in_a_row_id_is_that_rows_error(tmp_path: Path) -> None:
    rows = [{"id": "x\ud800", "prompt": "p"}, {"id": "y", "prompt": "q"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = load_job_file(write_job(tmp_path, "model: demo\njobs: [{name: a, input: d.jsonl}]\n"))
    items = list(plan_job(spec.jobs[0], spec.model, prepare(spec.jobs[0])))
    assert [type(i).__name__ for i in items] == ["Rejected", "Planned"]


def test_a_job_whose_input_is_its_own_output_is_refused(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "same.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    write_job(
        tmp_path,
        f"model: {tiny_model_path}\njobs: [{{name: same, input: out/same.jsonl}}]\n",
    )
    before = (tmp_path / "out" / "same.jsonl").read_bytes()
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 1 and "Loading model" not in result.output
    said = f"jobs.yaml:2:21: job 'same' reads {tmp_path / 'out' / 'same.jsonl'}, which is job "
    assert said + "'same''s results" in result.stderr
    assert (tmp_path / "out" / "same.jsonl").read_bytes() == before
    result = macbatch_run(tmp_path / "jobs.yaml", "--fresh")  # --fresh must not delete it
    assert result.exit_code == 1
    assert (tmp_path / "out" / "same.jsonl").read_bytes() == before


def test_n_past_the_limit_is_refused(tmp_path: Path, macbatch_run) -> None:
    write_job(tmp_path, "model: demo\njobs: [{name: a, prompts: [x], n: 1000000000}]\n")
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 1 and "Loading model" not in result.output
    assert "n must be at most 10,000, got 1,000,000,000" in result.stderr


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path: Path, macbatch_run) -> None:
    lines = ["model: demo", 'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 8) + "]")  # 8**9 values
    lines.append("jobs: [{name: a, prompts: *l8}]")
    (tmp_path / "jobs.yaml").write_text("\n".join(lines) + "\n")
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 1
    assert "aliases (*name) repeat more than 100,000 values" in result.stderr


def test_an_unwritable_output_directory_is_said_plainly(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    (tmp_path / "out" / LOCK_NAME).mkdir(parents=True)  # fails to open even as root
    write_job(tmp_path, f"model: {tiny_model_path}\njobs: [{{name: a, prompts: [x]}}]\n")
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 1 and "Loading model" not in result.output
    assert f"cannot write to the output directory {tmp_path / 'out'}" in result.stderr
    assert "the run stopped" not in result.stderr


def test_a_role_serve_refuses_is_a_row_error_in_run(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    rows = [
        {"id": "w", "messages": [{"role": "wizard", "content": "hi"}]},
        {"id": "u", "messages": [{"role": "user", "content": "hi"}]},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_job(
        tmp_path,
        f"model: {tiny_model_path}\njobs: [{{name: a, input: d.jsonl, "
        "sampling: {max_tokens: 2}}]\n",
    )
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 3
    [error] = read_jsonl(tmp_path / "out" / "a.errors.jsonl")
    assert error["custom_id"] == "w" and error["macbatch"]["line"] == 1
    assert "messages[0].role must be one of" in error["error"]["message"]
    assert [line["custom_id"] for line in read_jsonl(tmp_path / "out" / "a.jsonl")] == ["u"]


@pytest.mark.parametrize("depth", [101, 5_000])
def test_rows_nested_past_the_bound_are_rejected_with_their_line(
    tmp_path: Path, depth: int
) -> None:
    deep = '{"prompt": "x", "extra": ' + "[" * depth + "]" * depth + "}"
    (tmp_path / "d.jsonl").write_text('{"prompt": "ok"}\n' + deep + "\n")
    spec = load_job_file(write_job(tmp_path, "model: demo\njobs: [{name: a, input: d.jsonl}]\n"))
    items = list(plan_job(spec.jobs[0], spec.model, prepare(spec.jobs[0])))
    assert [(type(i).__name__, i.line) for i in items] == [("Planned", 1), ("Rejected", 2)]


def test_a_row_whose_schema_crashed_llguidance_is_that_rows_error(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    """An OpenAI-batch row with a $ref chain 1,000 deep made every rerun exit 139."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    deep = {"type": "json_schema", "json_schema": {"name": "d", "schema": ref_chain_schema(1000)}}
    rows = [
        {"custom_id": "ok", "body": body},
        {"custom_id": "deep", "body": {**body, "response_format": deep}},
        {"custom_id": "rules", "body": {**body, "guided_grammar": rule_chain_grammar(3000)}},
    ]
    (tmp_path / "batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_job(tmp_path, f"model: {tiny_model_path}\njobs: [{{name: a, input: batch.jsonl}}]\n")
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 3, result.output
    errors = read_jsonl(tmp_path / "out" / "a.errors.jsonl")
    assert [(e["custom_id"], e["macbatch"]["line"]) for e in errors] == [("deep", 2), ("rules", 3)]
    assert [line["custom_id"] for line in read_jsonl(tmp_path / "out" / "a.jsonl")] == ["ok"]
