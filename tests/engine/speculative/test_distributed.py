"""Speculative decoding under ``mlx.launch``: two ranks on 127.0.0.1 over MLX's ring backend, rank 0
drafting (prompt lookup, or a draft model it alone runs) and every rank running the verification
chunks in the broadcast packed step; greedy tokens against mlx-lm's single-process generation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx_lm
import pytest

from tests.support.oracle import mlx_lm_greedy_logprobs
from tests.support.ranks import mlx_launch
from tests.support.tiny import save_model
from tests.support.tp_worker import GREEDY, workload_prompts


@pytest.mark.parametrize(
    ("arch", "method"), [("llama", "ngram"), ("qwen3_5", "ngram"), ("qwen3", "draft")]
)
def test_two_ranks_speculate_and_generate_what_mlx_lm_generates(
    arch: str, method: str, tmp_path: Path
) -> None:
    """Chunked prefill, preemption and prefix-cache hits as in test_distributed.py, now with
    drafts verified on both ranks (a hybrid restores its split state slots on rejection). The
    draft model is the target itself, loaded whole on rank 0 only: every draft holds."""
    model_dir = save_model(tmp_path / arch, arch=arch, seed=1)
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "tests.support.tp_worker", str(model_dir), str(out), method]
    if method == "draft":
        command.append(str(model_dir))
    launched = mlx_launch(command, ranks=2, timeout_s=180)
    assert out.exists(), launched.stdout + launched.stderr
    result = json.loads(out.read_text())

    assert result["drafted"] > 0 and result["accepted"] > 0, result
    assert result["prefix_cache_hit_rate"] > 0
    if method == "ngram":  # a draft model that always agrees finishes before the pool fills
        assert result["preemptions"] > 0
    model, _ = mlx_lm.load(str(model_dir))
    for i, prompt in enumerate(workload_prompts()):
        expected = mlx_lm_greedy_logprobs(model, prompt, GREEDY.max_tokens)
        assert result["tokens"][i] == [t for t, _ in expected], f"request {i}"
