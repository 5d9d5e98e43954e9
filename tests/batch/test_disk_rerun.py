"""A rerun of a job reads its prompts back from the disk tier instead of computing them: the
first run (one row at a time) writes every row's full prompt blocks to ``--cache-dir``; a
``--fresh`` rerun in a new process's engine finds them. Its first row reads all of its prompt
from disk; every later row reads the system prompt the rows share from RAM (the first row put
it there) and the rest of its own prompt from disk. The oracle is each row's prompt as Hugging
Face's tokenizer and chat template make it, cut to whole 16-token blocks (the engine computes
at least the last token), re-read from the result lines and summary.json; the greedy replies of
both runs are the same."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.chat_prompt_oracle import chat_prompt_tokens, shared_prefix
from tests.support.job_files import read_jsonl, write_system_prompt_job

SYSTEM = "You answer every question about the disk tier in one short word. " * 6
PROMPTS = ["Apples or pears?", "Boats or cars?", "Cats or dogs?"]
BLOCK = 16  # tokens per KV block (EngineConfig's default)


def _cacheable(tokens: int) -> int:
    """A prompt's tokens a cache may hold: its full blocks but the one with its last token."""
    return (tokens - 1) // BLOCK * BLOCK


def _lines(out: Path) -> dict[str, dict]:
    return {line["custom_id"]: line for line in read_jsonl(out / "ask.jsonl")}


def test_a_rerun_reads_its_prompts_from_disk(tmp_path: Path, tiny_model_path: Path, macbatch_run):
    write_system_prompt_job(tmp_path, tiny_model_path, SYSTEM, PROMPTS, max_tokens=6)
    cache = tmp_path / "kv"
    args = (tmp_path / "jobs.yaml", "--max-in-flight", 1, "--cache-dir", cache)
    first = macbatch_run(*args)
    assert first.exit_code == 0, first.output
    before = _lines(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["disk_cached_prompt_tokens"] == 0
    assert all(line["macbatch"]["disk_cached_tokens"] == 0 for line in before.values())
    assert list(cache.glob("*/*/*.kvb"))

    again = macbatch_run(*args, "--fresh")
    assert again.exit_code == 0, again.output
    after = _lines(tmp_path / "out")
    prompts = chat_prompt_tokens(tiny_model_path, SYSTEM, PROMPTS)
    shared = shared_prefix(prompts) // BLOCK * BLOCK
    assert shared >= 4 * BLOCK
    expected_disk = []
    for i, prompt in enumerate(prompts):
        meta = after[str(i + 1)]["macbatch"]
        assert meta["prompt_tokens"] == len(prompt)
        assert meta["cached_tokens"] == _cacheable(len(prompt))
        expected_disk.append(_cacheable(len(prompt)) - (shared if i else 0))
        assert meta["disk_cached_tokens"] == expected_disk[-1]
        body = after[str(i + 1)]["response"]["body"]
        assert (
            body["choices"][0]["message"]
            == before[str(i + 1)]["response"]["body"]["choices"][0]["message"]
        )
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["disk_cached_prompt_tokens"] == sum(expected_disk)
    assert summary["cached_prompt_tokens"] == sum(_cacheable(len(p)) for p in prompts)
    assert f"{sum(expected_disk):,} of them from disk" in again.output
