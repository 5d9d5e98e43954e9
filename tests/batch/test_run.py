"""`macbatch run` end to end on a tiny random model saved to disk: outputs re-read line by line,
greedy results checked against the engine run one prompt at a time, resume, change detection,
scoring, headless events and bad input."""

from __future__ import annotations

import fcntl
import json
import re
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from macbatch.batch.paths import LEDGER_NAME, LOCK_NAME
from macbatch.batch.report import HeadlessReporter
from macbatch.batch.runner import RunOptions, run_jobs
from macbatch.batch.spec import load_job_file
from macbatch.engine import Engine, SamplingParams
from tests.support.job_files import read_jsonl, read_table, write_job

SYSTEM = "You are concise."
QUESTIONS = [
    {"id": "q1", "question": "the quick brown fox", "task": "a"},
    {"id": "q2", "question": "hello world", "task": "a"},
    {"id": "q3", "question": "MLX runs on Apple silicon", "task": "b"},
]
INLINE = ["What is MLX?", "how are you today?"]


@pytest.fixture
def project(tmp_path: Path, tiny_model_path: Path) -> Path:
    """A job file with a csv job (sampled, n=2), a jsonl job and an inline job (greedy)."""
    (tmp_path / "articles.csv").write_text(
        'article_id,text\na1,the quick brown fox\na2,"hello, world"\na3,MLX\n'
    )
    lines = [json.dumps(q) for q in QUESTIONS]
    lines.insert(2, '{"id": "broken", "question": ')
    (tmp_path / "questions.jsonl").write_text("\n".join(lines) + "\n")
    write_job(
        tmp_path,
        f"""
        version: 1
        model: {tiny_model_path}
        defaults:
          system: "{SYSTEM}"
          sampling: {{temperature: 0.8, max_tokens: 8, seed: 0}}
        output: {{dir: out}}
        jobs:
          - name: summarize
            input: {{path: articles.csv, id: "{{article_id}}"}}
            template: "Summarize:\\n\\n{{text}}"
            n: 2
          - name: questions
            input: questions.jsonl
            template: "Q: {{question}}"
            sampling: {{temperature: 0}}
          - name: inline
            prompts: {json.dumps(INLINE)}
            sampling: {{temperature: 0, max_tokens: 6}}
        """,
    )
    return tmp_path


def greedy_one_by_one(model: Path, prompts: list[Any], max_tokens: int) -> list[Any]:
    """The oracle: each prompt alone through a fresh engine."""
    engine = Engine.load(str(model))
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return [engine.generate([p], params)[0] for p in prompts]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def reply(line: dict[str, Any]) -> str:
    return line["response"]["body"]["choices"][0]["message"]["content"]


def test_multi_job_run_writes_every_request_once(
    project: Path, tiny_model_path: Path, macbatch_run
) -> None:
    result = macbatch_run(project / "jobs.yaml")
    assert result.exit_code == 3, result.output  # one malformed jsonl line
    out = project / "out"

    summarize = read_jsonl(out / "summarize.jsonl")
    assert Counter((x["custom_id"], x["macbatch"]["sample"]) for x in summarize) == {
        (a, s): 1 for a in ("a1", "a2", "a3") for s in (0, 1)
    }
    for line in summarize:
        body, meta = line["response"]["body"], line["macbatch"]
        assert line["id"] == f"batch_req_{meta['key']}" and line["error"] is None
        assert body["object"] == "chat.completion" and len(body["choices"]) == 1
        usage = body["usage"]
        assert usage["completion_tokens"] == meta["generated_tokens"] <= 8
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert meta["finish_reason"] == body["choices"][0]["finish_reason"]
        assert meta["finish_reason"] in ("stop", "length") and meta["job"] == "summarize"
        assert meta["ttft_ms"] >= 0 and meta["queue_ms"] >= 0
    assert {x["macbatch"]["line"] for x in summarize} == {2, 3, 4}

    questions = read_jsonl(out / "questions.jsonl")
    assert sorted(x["custom_id"] for x in questions) == ["q1", "q2", "q3"]
    errors = read_jsonl(out / "questions.errors.jsonl")
    assert len(errors) == 1 and errors[0]["macbatch"] == {"job": "questions", "line": 3}
    assert errors[0]["error"]["code"] == "invalid_input"
    assert errors[0]["error"]["message"].startswith("invalid JSON")

    inline = read_jsonl(out / "inline.jsonl")
    assert sorted(x["custom_id"] for x in inline) == ["1", "2"]

    # Greedy results equal the same prompts run one by one through the engine.
    by_id = {x["custom_id"]: x for x in questions}
    oracle = greedy_one_by_one(
        tiny_model_path, [chat(f"Q: {q['question']}") for q in QUESTIONS], max_tokens=8
    )
    for q, expected in zip(QUESTIONS, oracle, strict=True):
        line = by_id[q["id"]]
        assert reply(line) == expected.text
        assert line["macbatch"]["generated_tokens"] == len(expected.token_ids)
    by_id = {x["custom_id"]: x for x in inline}
    oracle = greedy_one_by_one(tiny_model_path, [chat(t) for t in INLINE], max_tokens=6)
    assert [reply(by_id[str(i + 1)]) for i in range(2)] == [o.text for o in oracle]

    summary = json.loads((out / "summary.json").read_text())
    assert (summary["ok"], summary["failed"], summary["skipped"]) == (11, 1, 0)
    assert summary["status"] == "complete" and summary["remaining"] == 0
    every = summarize + questions + inline
    assert summary["generated_tokens"] == sum(x["macbatch"]["generated_tokens"] for x in every)
    assert summary["prompt_tokens"] == sum(x["macbatch"]["prompt_tokens"] for x in every)
    cached = sum(x["macbatch"]["cached_tokens"] for x in every)
    assert summary["prefix_cache_hit_rate"] == round(cached / summary["prompt_tokens"], 3)
    assert summary["ttft_ms"]["p50"] <= summary["ttft_ms"]["p95"]
    assert summary["jobs"]["questions"] == {
        "total": 4,
        "ok": 3,
        "failed": 1,
        "skipped": 0,
        "capped": 0,
        "model": summary["model"],  # the file's, as no job names its own
        "output": str(out / "questions.jsonl"),
        "errors": str(out / "questions.errors.jsonl"),
        "table": str(out / "questions.csv"),
    }
    assert "complete: 11 ok, 1 failed, 0 skipped" in result.stdout

    # Rerunning skips everything done; the bad line is reported again, nothing is duplicated.
    before = {p.name: p.read_bytes() for p in out.glob("*.jsonl") if "errors" not in p.name}
    again = macbatch_run(project / "jobs.yaml")
    assert again.exit_code == 3
    assert {p.name: p.read_bytes() for p in out.glob("*.jsonl") if "errors" not in p.name} == (
        before
    )
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["ok"], summary["failed"], summary["skipped"]) == (0, 1, 11)
    assert len(read_jsonl(out / "questions.errors.jsonl")) == 1


def test_changed_job_is_refused_then_forced_or_fresh(
    project: Path, tiny_model_path: Path, macbatch_run
) -> None:
    job_file = project / "jobs.yaml"
    assert macbatch_run(job_file, "--job", "inline").exit_code == 0
    output = project / "out" / "inline.jsonl"
    first = output.read_bytes()

    job_file.write_text(job_file.read_text().replace("max_tokens: 6", "max_tokens: 5"))
    refused = macbatch_run(job_file, "--job", "inline")
    assert refused.exit_code == 1
    assert refused.stderr.startswith(
        "error: job 'inline' changed since its last run (sampling.max_tokens: 6 -> 5): "
        "2 completed requests would now give different results\n"
        "Rerun with --redo-changed to run exactly the changed requests again"
    )
    assert "Traceback" not in refused.output and output.read_bytes() == first

    job_file.write_text(job_file.read_text().replace('"how are you today?"]', '"x", "y"]'))
    forced = macbatch_run(job_file, "--job", "inline", "--force")
    assert forced.exit_code == 0, forced.output
    lines = read_jsonl(output)
    assert output.read_bytes().startswith(first)
    ids = [x["custom_id"] for x in lines]  # completion order (jobs.md): the first run's, then 3
    assert sorted(ids[:2]) == ["1", "2"] and ids[2:] == ["3"]
    assert lines[2]["macbatch"]["generated_tokens"] <= 5

    fresh = macbatch_run(job_file, "--job", "inline", "--fresh")
    assert fresh.exit_code == 0, fresh.output
    lines = read_jsonl(output)
    assert sorted(x["custom_id"] for x in lines) == ["1", "2", "3"]
    oracle = greedy_one_by_one(tiny_model_path, [chat(t) for t in ("What is MLX?", "x", "y")], 5)
    assert [reply(x) for x in sorted(lines, key=lambda x: x["custom_id"])] == [
        o.text for o in oracle
    ]


def test_redo_changed_reruns_exactly_the_changed_rows(
    project: Path, tiny_model_path: Path, macbatch_run
) -> None:
    """--force keeps a stale answer; --redo-changed replaces just that row's line (the other
    lines stay byte for byte) with the answer to the new row."""
    job_file = project / "jobs.yaml"
    assert macbatch_run(job_file, "-j", "questions").exit_code == 3  # the one broken line
    output = project / "out" / "questions.jsonl"
    before = {x["custom_id"]: x for x in read_jsonl(output)}
    questions = project / "questions.jsonl"
    questions.write_text(questions.read_text().replace("hello world", "goodbye moon"))

    forced = macbatch_run(job_file, "-j", "questions", "--force")
    assert forced.exit_code == 3 and {x["custom_id"]: x for x in read_jsonl(output)} == before

    redone = macbatch_run(job_file, "-j", "questions", "--redo-changed")
    assert redone.exit_code == 3, redone.output
    assert "questions: 1 results whose rows or settings changed were removed" in redone.stdout
    after = {x["custom_id"]: x for x in read_jsonl(output)}
    assert sorted(after) == ["q1", "q2", "q3"]
    assert after["q1"] == before["q1"] and after["q3"] == before["q3"]
    oracle = greedy_one_by_one(tiny_model_path, [chat("Q: goodbye moon")], 8)[0]
    assert reply(after["q2"]) == oracle.text
    assert after["q2"]["macbatch"]["key"] != before["q2"]["macbatch"]["key"]

    again = macbatch_run(job_file, "-j", "questions")  # nothing changed any more: plain resume
    assert again.exit_code == 3 and {x["custom_id"]: x for x in read_jsonl(output)} == after


def test_redo_changed_with_force_is_refused(project: Path, macbatch_run) -> None:
    result = macbatch_run(project / "jobs.yaml", "--redo-changed", "--force")
    assert result.exit_code == 1 and "--redo-changed goes alone" in result.stderr


def test_changed_input_row_is_named(project: Path, macbatch_run) -> None:
    assert macbatch_run(project / "jobs.yaml", "-j", "summarize").exit_code == 0
    csv = project / "articles.csv"
    csv.write_text(csv.read_text().replace('a2,"hello, world"', "a2,changed"))
    refused = macbatch_run(project / "jobs.yaml", "-j", "summarize")
    assert refused.exit_code == 1
    assert (
        "job 'summarize' changed since its last run (input rows changed (first: id 'a2' on "
        "line 3)): 2 completed requests would now give different results"
    ) in refused.stderr


def test_scoring_reports_accuracy_per_task(tmp_path: Path, tiny_model_path: Path, macbatch_run):
    oracle = greedy_one_by_one(tiny_model_path, [[{"role": "user", "content": "2+2"}]], 8)[0]
    rows = [
        {"id": "r1", "task": "math", "question": "2+2", "expected": f"  {oracle.text}\n"},
        {"id": "r2", "task": "math", "question": "2+2", "expected": "certainly wrong"},
        {"id": "r3", "task": "words", "question": "2+2", "expected": oracle.text},
        {"id": "r4", "question": "2+2"},
    ]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - name: qa
            input: qa.jsonl
            template: "{{question}}"
            sampling: {{temperature: 0, max_tokens: 8}}
            score: {{field: expected}}
        """,
    )
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 0, result.output
    lines = {x["custom_id"]: x["macbatch"] for x in read_jsonl(tmp_path / "out" / "qa.jsonl")}
    assert {k: (m["correct"], m["group"]) for k, m in lines.items()} == {
        "r1": (True, "math"),
        "r2": (False, "math"),
        "r3": (True, "words"),
        "r4": (None, None),
    }
    table = read_table(tmp_path / "out" / "qa.csv")  # the table says the same, row by row
    assert {r["custom_id"]: r["correct"] for r in table} == {
        "r1": "true",
        "r2": "false",
        "r3": "true",
        "r4": "",
    }
    accuracy = json.loads((tmp_path / "out" / "summary.json").read_text())["jobs"]["qa"]["accuracy"]
    assert accuracy == {
        "scored": 3,
        "correct": 2,
        "accuracy": 0.6667,
        "groups": {
            "math": {"scored": 2, "correct": 1, "accuracy": 0.5},
            "words": {"scored": 1, "correct": 1, "accuracy": 1.0},
        },
    }
    assert "accuracy 66.7% (2/3)" in result.stdout and "math: 50.0% (1/2)" in result.stdout


def test_progress_lines_when_the_output_is_not_a_terminal(project: Path, macbatch_run) -> None:
    """Issue 65: to a file or a pipe (the test runner's output is neither a terminal) run prints
    a plain line every --progress-interval (0 here: one per loop pass, bounded by the work, not
    a clock), done / total, rates and time left, without --headless."""
    result = macbatch_run(project / "jobs.yaml", "--progress-interval", "0", "-j", "inline")
    assert result.exit_code == 0, result.output
    shape = re.compile(r"(\d+) / 2 done · [\d.,]+ rows/s · [\d,]+ tok/s · [\d:-]+ left")
    lines = [m for line in result.stdout.splitlines() if (m := shape.fullmatch(line))]
    assert lines and lines[-1].group(1) == "2", result.stdout
    assert [int(m.group(1)) for m in lines] == sorted(int(m.group(1)) for m in lines)
    assert "\x1b[" not in result.stdout  # no redraws


def test_headless_prints_json_events_on_stderr(project: Path, macbatch_run) -> None:
    result = macbatch_run(
        project / "jobs.yaml", "--headless", "--progress-interval", "0", "-j", "inline"
    )
    assert result.exit_code == 0 and result.stdout == ""
    events = [json.loads(line) for line in result.stderr.splitlines()]
    kinds = [e["event"] for e in events]
    start = kinds.index("start")  # after the notes (loading the model, the disk cache's cap)
    assert start > 0 and set(kinds[:start]) == {"note"} and kinds[-1] == "summary"
    assert any(e["message"].startswith("disk KV cache: up to ") for e in events[:start])
    assert "progress" in kinds
    last = [e for e in events if e["event"] == "progress"][-1]
    assert last["done"] == last["total"] == 2 and last["jobs"]["inline"]["done"] == 2
    assert events[-1]["ok"] == 2


class CountingEngine:
    """Wraps the real engine to record how many requests it held at once, and from which jobs."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.live, self.peak, self.prompts = engine, 0, 0, {}

    def enqueue(self, request: Any) -> None:  # rows are prepared off the loop, then queued
        self.engine.enqueue(request)
        self.live += 1
        self.peak = max(self.peak, self.live)

    def step(self) -> list[Any]:
        outputs = self.engine.step()
        self.live -= sum(o.finished for o in outputs)
        return outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_requests_in_flight_are_bounded(project: Path, tiny_model_path: Path) -> None:
    spec = load_job_file(project / "jobs.yaml")
    engines: list[CountingEngine] = []

    def load(name: str) -> CountingEngine:
        engines.append(CountingEngine(Engine.load(name)))
        return engines[0]

    summary = run_jobs(spec, RunOptions(max_in_flight=3), HeadlessReporter(60), load)
    assert summary["ok"] == 11 and engines[0].peak == 3


def test_line_written_before_the_ledger_commit_is_not_repeated(project: Path, macbatch_run) -> None:
    """The window a kill -9 can hit: a line on disk, its ledger row not committed, and a
    partial line after it. The rerun adopts the line, cuts the partial one, runs nothing twice."""
    job_file = project / "jobs.yaml"
    assert macbatch_run(job_file, "-j", "summarize").exit_code == 0
    output = project / "out" / "summarize.jsonl"
    last = read_jsonl(output)[-1]
    size_before_last = output.stat().st_size - len(output.read_bytes().splitlines()[-1]) - 1
    with sqlite3.connect(project / "out" / LEDGER_NAME) as db:
        db.execute("DELETE FROM done WHERE key=?", (last["macbatch"]["key"],))
        db.execute("UPDATE files SET size=? WHERE job='summarize'", (size_before_last,))
    with output.open("ab") as f:
        f.write(b'{"id": "batch_req_partial", "custom_id": "a')
    result = macbatch_run(job_file, "-j", "summarize")
    assert result.exit_code == 0, result.output
    assert "removed a partial last line" in result.stdout
    lines = read_jsonl(output)
    assert len(lines) == 6 and lines[-1] == last
    with sqlite3.connect(project / "out" / LEDGER_NAME) as db:
        keys = {k for (k,) in db.execute("SELECT key FROM done WHERE job='summarize'")}
    assert keys == {x["macbatch"]["key"] for x in lines}
    assert json.loads((project / "out" / "summary.json").read_text())["skipped"] == 6


def test_bad_inputs_stop_before_the_model_loads(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    def run(yaml_jobs: str) -> str:
        write_job(tmp_path, f"model: {tiny_model_path}\njobs:\n{yaml_jobs}")
        result = macbatch_run(tmp_path / "jobs.yaml")
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert "Loading model" not in result.output
        return result.stderr

    assert run("  - {name: a, input: missing.csv, template: x}\n").endswith(
        f"jobs.yaml:3:15: input file not found: {tmp_path / 'missing.csv'}\n"
    )
    assert not (tmp_path / "out").exists()
    (tmp_path / "d.csv").write_text("id,text\n")
    assert run("  - {name: a, input: d.csv, template: '{text}'}\n") == (
        f"error: job 'a' is empty: {tmp_path / 'd.csv'} has no rows\n"
    )
    (tmp_path / "d.csv").write_text("id,text\nx,1\ny,2\nx,3\n")
    assert run("  - {name: a, input: d.csv, template: '{text}'}\n") == (
        f"error: job 'a': duplicate id 'x' at {tmp_path / 'd.csv'} line 4 (first used at "
        f"{tmp_path / 'd.csv'} line 2); ids must be unique within a job: make input.id "
        "produce unique ids (e.g. add another field to it)\n"
    )
    assert "duplicate id 'k' at prompts item 2 (first used at prompts item 1)" in run(
        "  - {name: a, prompts: [{id: k, prompt: x}, {id: k, prompt: y}]}\n"
    )
    assert "template names field 'txt', which rows lack; did you mean 'text'?" in run(
        "  - {name: a, input: d.csv, template: '{txt}'}\n"
    )


def test_unknown_job_model_and_lock(tmp_path: Path, tiny_model_path: Path, macbatch_run):
    write_job(tmp_path, f"model: {tiny_model_path}\njobs: [{{name: a, prompts: [x]}}]\n")
    result = macbatch_run(tmp_path / "jobs.yaml", "--job", "zzz")
    assert result.exit_code == 1
    assert f"no job named 'zzz' in {tmp_path / 'jobs.yaml'}; jobs: a" in result.stderr

    result = macbatch_run(tmp_path / "jobs.yaml", "--model", str(tmp_path / "nowhere"))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"error: no model directory at {tmp_path / 'nowhere'}" in result.stderr

    result = macbatch_run(tmp_path / "jobs.yaml", "--force", "--fresh")
    assert result.exit_code == 1 and "--force and --fresh contradict" in result.stderr

    (tmp_path / "out").mkdir(exist_ok=True)
    with (tmp_path / "out" / LOCK_NAME).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 1
    assert f"another macbatch run is writing to {tmp_path / 'out'}" in result.stderr


@pytest.mark.parametrize("columns", [None, "40", "160"])
def test_deleting_an_output_file_redoes_that_job(
    project: Path, macbatch_run, monkeypatch: pytest.MonkeyPatch, columns: str | None
) -> None:
    """Whatever the terminal width (or none, as in cron), a note is one greppable line."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert macbatch_run(project / "jobs.yaml", "-j", "inline").exit_code == 0
    output = project / "out" / "inline.jsonl"
    first = read_jsonl(output)
    output.unlink()
    result = macbatch_run(project / "jobs.yaml", "-j", "inline")
    assert result.exit_code == 0
    assert f"{output} is shorter than last recorded" in result.stdout.splitlines()[0]
    again = read_jsonl(output)
    assert sorted(x["macbatch"]["key"] for x in again) == sorted(
        x["macbatch"]["key"] for x in first
    )
    assert json.loads((project / "out" / "summary.json").read_text())["ok"] == 2


def test_demo_job_without_max_tokens_caps_each_reply_to_the_room_left(tmp_path: Path, macbatch_run):
    """The demo model's whole context is the default max_tokens (512): each reply is capped to
    the room its prompt leaves, and every line records it; the summary flags no reply, since
    nobody asked for more (issue 50: tests/batch/test_tables.py has a max_tokens that was)."""
    write_job(
        tmp_path,
        """
        version: 1
        model: demo
        jobs:
          - name: ask
            prompts: ["What is 48 + 37?", "Reverse the word planet."]
        """,
    )
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 0, result.stdout
    lines = read_jsonl(tmp_path / "out" / "ask.jsonl")
    assert len(lines) == 2
    for line in lines:
        meta = line["macbatch"]
        assert meta["capped_max_tokens"] == 512 - meta["prompt_tokens"]
        assert meta["finish_reason"] == "stop"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] == 2 and summary["jobs"]["ask"]["capped"] == 0
    assert "replies capped" not in result.stdout


def test_the_resume_hint_keeps_what_changes_results(tmp_path: Path) -> None:
    """The printed command resumes with the same model, jobs, output dir, KV format and
    speculative options."""
    import shlex

    from macbatch.batch.command import EngineOptions, resume_command

    spec = {"speculative": "ngram", "draft_model": None, "num_speculative_tokens": 3}
    given = EngineOptions(kv_bits=4, spec=spec)
    hint = resume_command(tmp_path / "j.yaml", "demo", ["a", "b"], tmp_path / "o", given, True)
    assert shlex.split(hint) == [
        "macbatch", "run", str(tmp_path / "j.yaml"), "-m", "demo", "-j", "a", "-j", "b",
        "-o", str(tmp_path / "o"), "--kv-bits", "4", "--speculative", "ngram",
        "--num-speculative-tokens", "3", "--headless",
    ]  # fmt: skip
