"""`macbatch run` reports prompt tokens read from the prefix cache on every result line (the
body's `usage.prompt_tokens_details.cached_tokens` and `macbatch.cached_tokens`) and in its
summary (`cached_prompt_tokens`, summary.json and the printed line). Rows share a long system
prompt and run one at a time, so every row after the first reads the full KV blocks of what
they share: the oracle is that shared prefix, tokenized by Hugging Face's tokenizer and chat
template for the model, cut to whole blocks."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.chat_prompt_oracle import chat_prompt_tokens, shared_prefix
from tests.support.job_files import read_jsonl, write_system_prompt_job

SYSTEM = "You answer in one word. " * 12
# each opens with a different word, so what rows share ends where the user text starts
PROMPTS = ["Apples or pears?", "Boats or cars?", "Cats or dogs?", "Dusk or dawn?"]
BLOCK = 16  # tokens per KV block (EngineConfig's default)


def _shared_blocks(model: Path) -> int:
    shared = shared_prefix(chat_prompt_tokens(model, SYSTEM, PROMPTS))
    assert shared > 3 * BLOCK
    return shared // BLOCK * BLOCK


def test_cached_tokens_on_lines_and_summary(tmp_path: Path, tiny_model_path: Path, macbatch_run):
    write_system_prompt_job(tmp_path, tiny_model_path, SYSTEM, PROMPTS, max_tokens=2)
    result = macbatch_run(tmp_path / "jobs.yaml", "--max-in-flight", 1)
    assert result.exit_code == 0, result.output
    lines = read_jsonl(tmp_path / "out" / "ask.jsonl")
    cached = sorted(line["macbatch"]["cached_tokens"] for line in lines)
    for line in lines:
        usage = line["response"]["body"]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == line["macbatch"]["cached_tokens"]
    assert cached == [0] + [_shared_blocks(tiny_model_path)] * (len(PROMPTS) - 1)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["cached_prompt_tokens"] == sum(cached)
    assert summary["prefix_cache_hit_rate"] == round(sum(cached) / summary["prompt_tokens"], 3)
    assert f"{sum(cached):,} prompt tokens (" in result.output
