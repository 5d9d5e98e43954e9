"""Speculative decoding under ``mlx.launch``: two ranks on 127.0.0.1 over MLX's ring backend, rank 0
drafting (prompt lookup, a draft model or the checkpoint's MTP layer, which it alone runs) and
every rank running the verification chunks in the broadcast packed step; greedy tokens against
mlx-lm's single-process generation, and the hidden states the MTP layer reads against mlx-lm's
forward of the whole model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from macbatch.engine.model.adapter import text_model
from tests.support.mtp import save_predicting_checkpoint, without_mtp
from tests.support.oracle import mlx_lm_greedy_logprobs
from tests.support.ranks import mlx_launch
from tests.support.tiny import save_model
from tests.support.tp_worker import GREEDY, workload_prompts


@pytest.mark.parametrize(
    ("arch", "method"),
    [("llama", "ngram"), ("qwen3_5", "ngram"), ("qwen3", "draft"), ("qwen3_5", "auto")],
)
def test_two_ranks_speculate_and_generate_what_mlx_lm_generates(
    arch: str, method: str, tmp_path: Path
) -> None:
    """Chunked prefill, preemption and prefix-cache hits as in test_distributed.py, now with
    drafts verified on both ranks (a hybrid restores its split state slots on rejection). The
    draft model is the target itself, loaded whole on rank 0 only: every draft holds. ``auto``
    on a checkpoint with an MTP layer (one that predicts well) drafts with it, rank 0's alone,
    beside an LM head mlx-lm splits by vocabulary (untied embeddings), from the hidden states
    of the split model."""
    if method == "auto":
        model_dir = save_predicting_checkpoint(tmp_path / arch, arch, tie_word_embeddings=False)
    else:
        model_dir = save_model(tmp_path / arch, arch=arch, seed=1)
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "tests.support.tp_worker", str(model_dir), str(out), method]
    if method == "draft":
        command.append(str(model_dir))
    launched = mlx_launch(command, ranks=2, timeout_s=180)
    assert out.exists(), launched.stdout + launched.stderr
    result = json.loads(out.read_text())

    assert result["speculative"] == ("mtp" if method == "auto" else method)
    assert result["drafted"] > 0 and result["accepted"] > 0, result
    assert result["prefix_cache_hit_rate"] > 0
    if method != "draft":  # a draft model that always agrees finishes before the pool fills
        assert result["preemptions"] > 0
    model, _ = mlx_lm.load(str(without_mtp(model_dir) if method == "auto" else model_dir))
    for i, prompt in enumerate(workload_prompts()):
        expected = mlx_lm_greedy_logprobs(model, prompt, GREEDY.max_tokens)
        assert result["tokens"][i] == [t for t, _ in expected], f"request {i}"
        if method == "auto":
            _assert_whole_hidden_states(
                model, prompt + result["tokens"][i], result["hidden"][str(i)]
            )


def _assert_whole_hidden_states(model, tokens: list[int], rows: dict[str, list[float]]) -> None:
    """The rows rank 0's MTP layer was handed (position -> hidden state) are the whole model's
    normed last hidden states there (mlx-lm's forward), not one rank's partial sums."""
    assert rows, "the MTP layer was handed no hidden states"
    whole = np.array(text_model(model).model(mx.array([tokens]))[0])
    positions = sorted(int(p) for p in rows)
    got = np.array([rows[str(p)] for p in positions])
    np.testing.assert_allclose(got, whole[positions], rtol=1e-4, atol=1e-4)


def test_a_drafter_rank_zero_cannot_load_stops_every_rank_with_the_reason(tmp_path: Path) -> None:
    """``mtp`` on a checkpoint without MTP weights: rank 0 says why, and the follower, which
    loaded the model, stops too instead of waiting in its runner's first collective (until the
    watchdog's minute ran out on rank 0's stop)."""
    model_dir = save_model(tmp_path / "plain", arch="qwen3_5")
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "tests.support.tp_worker", str(model_dir), str(out), "mtp"]
    launched = mlx_launch(command, ranks=2, timeout_s=50)
    said = launched.stdout + launched.stderr
    assert "has no MTP weights" in said and "rank 0 could not load its drafter" in said, said
    assert not out.exists()
