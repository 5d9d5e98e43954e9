"""`macbatch run` comparing fine-tunes: one job file, two adapters and the base over the same
scored rows, all in one run on one engine. Re-read from the output files, every reply equals
mlx-lm's own generation with that job's adapter loaded (``mlx_lm.load(path, adapter_path=)``);
summary.json names each job's adapter beside its accuracy, and the summary prints them side by
side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx_lm
import pytest

from tests.support.job_files import read_jsonl, write_job, write_rows
from tests.support.lora import ATTENTION, MLP, save_adapter
from tests.support.oracle import mlx_lm_greedy

PROMPTS = ["the quick brown fox", "hello world", "MLX runs on Apple silicon"]
MAX_TOKENS = 6


def _reply(model_path: Path, adapter: Path | None, prompt: str) -> str:
    model, tokenizer = mlx_lm.load(str(model_path), adapter_path=adapter and str(adapter))
    ids = tokenizer.encode(prompt)
    whole = tokenizer.decode(ids + mlx_lm_greedy(model, ids, MAX_TOKENS))
    return whole[len(tokenizer.decode(ids)) :].lstrip(" ")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "attn": save_adapter(root / "attn", seed=1, keys=ATTENTION),
        "mlp": save_adapter(root / "mlp", seed=2, keys=MLP, rank=8),
    }


def test_two_adapters_and_the_base_in_one_run(
    tmp_path: Path, tiny_model_path: Path, adapters: dict[str, Path], macbatch_run: Any
) -> None:
    want = {
        name: [_reply(tiny_model_path, adapters.get(name), p) for p in PROMPTS]
        for name in ("base", "attn", "mlp")
    }
    # the expected answers are the attn adapter's: it scores 3/3, the others less
    write_rows(
        tmp_path / "rows.csv",
        [
            {"id": str(i), "q": p, "answer": a}
            for i, (p, a) in enumerate(zip(PROMPTS, want["attn"]))
        ],
    )
    job = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        defaults:
          chat: false
          template: "{{q}}"
          score: {{field: answer}}
          sampling: {{temperature: 0, max_tokens: {MAX_TOKENS}, ignore_eos: true}}
        jobs:
          - name: base
            input: {{path: rows.csv, id: "{{id}}"}}
          - name: attn
            adapter: {adapters["attn"]}
            input: {{path: rows.csv, id: "{{id}}"}}
          - name: mlp
            adapter: {adapters["mlp"]}
            input: {{path: rows.csv, id: "{{id}}"}}
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    for name in ("base", "attn", "mlp"):
        lines = sorted(read_jsonl(out / f"{name}.jsonl"), key=lambda line: line["custom_id"])
        assert [line["response"]["body"]["choices"][0]["text"] for line in lines] == want[name]
    summary = json.loads((out / "summary.json").read_text())
    jobs = summary["jobs"]
    assert jobs["attn"]["adapter"] == str(adapters["attn"].resolve())
    assert "adapter" not in jobs["base"]
    assert jobs["attn"]["accuracy"]["accuracy"] == 1.0
    assert "side by side on" in result.output and "attn (attn) 100.0% (3/3)" in result.output
    # the attn job's adapter changed: a rerun refuses it as changed until --redo-changed
    job.write_text(job.read_text().replace(str(adapters["attn"]), str(adapters["mlp"]), 1))
    rerun = macbatch_run(job)
    assert rerun.exit_code != 0 and "--redo-changed" in rerun.output
    assert macbatch_run(job, "--redo-changed").exit_code == 0
    lines = sorted(read_jsonl(out / "attn.jsonl"), key=lambda line: line["custom_id"])
    assert [line["response"]["body"]["choices"][0]["text"] for line in lines] == want["mlp"]


def test_a_missing_adapter_is_refused_before_anything_runs(
    tmp_path: Path, tiny_model_path: Path, macbatch_run: Any
) -> None:
    job = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - name: tuned
            adapter: ./nowhere
            prompts: ["hello"]
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code != 0
    assert "not an adapter directory" in result.output
    assert not (tmp_path / "out").exists()
