"""`macbatch run` with a model per job (issue 49): two tiny models saved in Hugging Face layout,
jobs naming either. Re-read from the output files: every reply equals mlx-lm's greedy generation
of its job's model, every line names that model, each model loaded once, the ledger records the
model of each row and summary.json the model of each job. A rerun with a job's model changed is
refused (with --force too: it would mix two models' answers in one file) until --redo-changed
answers its lines again with the new model; a ledger from before keeps working; a model too
large for the memory free is refused before it loads."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import mlx_lm
import pytest

from macbatch.batch.ledger import Ledger
from macbatch.batch.paths import LEDGER_NAME
from macbatch.models.memory import parse_meminfo
from tests.support.job_files import read_jsonl, write_job
from tests.support.oracle import mlx_lm_greedy
from tests.support.tiny import save_two_models

PROMPTS = ["the quick brown fox", "hello world", "MLX runs on Apple silicon"]
MAX_TOKENS = 6
MEMINFO = Path(__file__).parents[1] / "support" / "memory" / "meminfo_small.txt"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return save_two_models(tmp_path_factory.mktemp("job-models"))


@pytest.fixture(scope="module")
def oracle(two_models: dict[str, Path]) -> dict[str, list[str]]:
    """mlx-lm's greedy text of each prompt on each model (plain text prompts, EOS ignored): the
    text its tokens add after the prompt's, less leading spaces (a reply's text starts at its
    first character, as the engine's detokenizer gives it)."""
    texts: dict[str, list[str]] = {}
    for name, path in two_models.items():
        model, tokenizer = mlx_lm.load(str(path))
        texts[name] = []
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            whole = tokenizer.decode(ids + mlx_lm_greedy(model, ids, MAX_TOKENS))
            texts[name].append(whole[len(tokenizer.decode(ids)) :].lstrip(" "))
    return texts


def job_file(directory: Path, models: dict[str, Path], b_model: str) -> Path:
    """Job a on the file's model (alpha), job b on ``b_model``, job c on alpha again."""
    return write_job(
        directory,
        f"""
        model: {models["alpha"]}
        defaults:
          chat: false
          sampling: {{temperature: 0, max_tokens: {MAX_TOKENS}, ignore_eos: true}}
        jobs:
          - name: a
            prompts: {json.dumps(PROMPTS)}
          - name: b
            model: {models[b_model]}
            prompts: {json.dumps(PROMPTS)}
          - name: c
            model: {models["alpha"]}
            prompts: {json.dumps(PROMPTS[:2])}
        """,
    )


def replies(path: Path) -> dict[str, tuple[str, str]]:
    """custom_id -> (the model its response names, its text), re-read from the file."""
    return {
        line["custom_id"]: (
            line["response"]["body"]["model"],
            line["response"]["body"]["choices"][0]["text"],
        )
        for line in read_jsonl(path)
    }


def ledger_models(out: Path) -> dict[tuple[str, str], str | None]:
    with sqlite3.connect(out / LEDGER_NAME) as db:
        rows = db.execute("SELECT job, custom_id, model FROM done").fetchall()
    return {(job, custom_id): model for job, custom_id, model in rows}


def expected(models: dict[str, Path], oracle: dict[str, list[str]], name: str, count: int) -> Any:
    return {str(i + 1): (str(models[name]), oracle[name][i]) for i in range(count)}


def test_each_job_runs_on_its_model_each_loaded_once(
    tmp_path: Path,
    two_models: dict[str, Path],
    oracle: dict[str, list[str]],
    macbatch_run: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from macbatch.engine import Engine

    loads: list[str] = []
    load = Engine.load

    def counted(source: str, *args: Any, **kwargs: Any) -> Engine:
        loads.append(Path(source).name)
        return load(source, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", staticmethod(counted))
    result = macbatch_run(job_file(tmp_path, two_models, "beta"))
    assert result.exit_code == 0, result.output
    assert loads == ["alpha", "beta"]  # a and c share alpha's one load, b runs on beta's
    out = tmp_path / "out"
    assert replies(out / "a.jsonl") == expected(two_models, oracle, "alpha", 3)
    assert replies(out / "b.jsonl") == expected(two_models, oracle, "beta", 3)
    assert replies(out / "c.jsonl") == expected(two_models, oracle, "alpha", 2)
    answered = ledger_models(out)
    assert len(answered) == 8
    assert all(model == str(two_models["beta" if job == "b" else "alpha"])
               for (job, _), model in answered.items())  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == str(two_models["alpha"])  # the file's
    assert {name: job["model"] for name, job in summary["jobs"].items()} == {
        "a": str(two_models["alpha"]),
        "b": str(two_models["beta"]),
        "c": str(two_models["alpha"]),
    }
    assert summary["ok"] == 8 and summary["status"] == "complete"


def test_a_changed_model_never_mixes_two_models_in_one_file(
    tmp_path: Path, two_models: dict[str, Path], oracle: dict[str, list[str]], macbatch_run: Any
) -> None:
    first = job_file(tmp_path, two_models, "beta")
    assert macbatch_run(first).exit_code == 0
    out = tmp_path / "out"
    # job b moves from beta to alpha; its three lines were beta's
    changed = job_file(tmp_path, two_models, "alpha")
    refused = macbatch_run(changed)
    assert refused.exit_code == 1
    assert "job 'b' changed since its last run (model: " in refused.stderr
    forced = macbatch_run(changed, "--force")
    assert forced.exit_code == 1
    assert (
        f"job 'b' now runs on {two_models['alpha']}, but 3 of its completed lines were answered "
        f"by another model (3 by {two_models['beta']}); --force would mix"
    ) in forced.stderr
    assert replies(out / "b.jsonl") == expected(two_models, oracle, "beta", 3)  # untouched
    redone = macbatch_run(changed, "--redo-changed")
    assert redone.exit_code == 0, redone.output
    assert replies(out / "b.jsonl") == expected(two_models, oracle, "alpha", 3)
    assert {m for (job, _), m in ledger_models(out).items() if job == "b"} == {
        str(two_models["alpha"])
    }


def test_a_ledger_from_before_gets_the_model_column(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_NAME
    with sqlite3.connect(path) as db:  # the schema before ledgers kept models
        db.executescript(
            "CREATE TABLE done (key TEXT PRIMARY KEY, job TEXT NOT NULL, custom_id TEXT NOT "
            "NULL, sample INTEGER NOT NULL, correct INTEGER, grp TEXT, finished_at REAL NOT "
            "NULL); INSERT INTO done VALUES ('k1', 'a', '1', 0, NULL, NULL, 0.0);"
        )
    ledger = Ledger(path)
    try:
        assert ledger.lookup("a", "1", 0) == "k1"
        assert ledger.models("a") == {None: 1}
    finally:
        ledger.close()


def test_a_model_too_large_is_refused_before_it_loads(
    tmp_path: Path,
    two_models: dict[str, Path],
    macbatch_run: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 MiB free (a recorded /proc/meminfo): the smallest KV pool alone does not fit."""
    import macbatch.models.memory

    monkeypatch.setattr(
        macbatch.models.memory, "read_memory", lambda: parse_meminfo(MEMINFO.read_text())
    )
    result = macbatch_run(job_file(tmp_path, two_models, "beta"))
    assert result.exit_code == 1
    assert f"model '{two_models['alpha']}' needs about" in result.stderr
    assert "(the model of a, c)" in result.stderr
    assert "close other programs (the model" in result.stderr  # no serve options to lower
    assert not (tmp_path / "out" / "a.jsonl").exists() or not read_jsonl(
        tmp_path / "out" / "a.jsonl"
    )


def test_a_model_that_fails_to_load_skips_only_its_jobs(
    tmp_path: Path, two_models: dict[str, Path], oracle: dict[str, list[str]], macbatch_run: Any
) -> None:
    """Issue 61, item 10: the first job's model fails to load (its weights are not a
    safetensors file); the second job's model still runs, the error names the job skipped, its
    model and why, the run exits non-zero and says how to run the rest."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(two_models["alpha"], broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    path = write_job(
        tmp_path,
        f"""
        model: {broken}
        defaults:
          chat: false
          sampling: {{temperature: 0, max_tokens: {MAX_TOKENS}, ignore_eos: true}}
        jobs:
          - name: first
            prompts: {json.dumps(PROMPTS)}
          - name: second
            model: {two_models["beta"]}
            prompts: {json.dumps(PROMPTS)}
        """,
    )
    result = macbatch_run(path)
    assert result.exit_code == 1, result.output
    out = tmp_path / "out"
    assert replies(out / "second.jsonl") == expected(two_models, oracle, "beta", 3)
    assert f"job first was not run: cannot load model '{broken}'" in result.stderr
    assert "safetensors" in result.stderr.lower()  # why
    assert f"macbatch run {path}" in result.stderr  # how to run the rest
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "incomplete"
    assert summary["jobs"]["first"]["not_run"].startswith(f"cannot load model '{broken}'")
    assert summary["jobs"]["second"]["ok"] == 3
    # once the model is mended, the same command runs the job left and keeps the other's lines
    shutil.rmtree(broken)
    shutil.copytree(two_models["alpha"], broken)
    again = macbatch_run(path)
    assert again.exit_code == 0, again.output
    assert len(read_jsonl(out / "first.jsonl")) == 3
    assert replies(out / "second.jsonl") == expected(two_models, oracle, "beta", 3)
