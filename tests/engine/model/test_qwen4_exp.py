"""Qwen4-exp (mlx-vlm's ``qwen4_exp``) through the packed, paged step: Qwen Sparse Attention's
block indexer (its raw keys paged beside the K/V, each row's best blocks and the tail after its
last whole block read alone), Gated DeltaNet layers through mlx-vlm's own recurrent cache calls,
an n-gram per-layer embedding whose token-id state starts as EOS, MoE and two residual streams.
Greedy tokens and log-probabilities equal mlx-vlm's own generation on a tiny random model whose
selection drops positions of any context past ``SPARSE_FROM`` tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.indexer_keys import IndexerKeysGroup
from macbatch.engine.model.families import Library, family, unsupported_reason
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import STAGGERED
from tests.support.tiny_qwen4_exp import SPARSE_FROM, save_qwen4_exp
from tests.support.vlm_oracle import (
    assert_fp8_staggered_matches_mlx_vlm,
    assert_matches_mlx_vlm_text,
    assert_preemption_then_disk_restart,
    assert_sparse_not_dense,
    assert_staggered_text_matches,
)

pytest.importorskip("mlx_vlm")

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, object]:
    """The tiny checkpoint and mlx-vlm's own model of it."""
    from mlx_vlm.utils import load_model

    path = save_qwen4_exp(tmp_path_factory.mktemp("qwen4_exp"))
    return path, load_model(path)


@pytest.fixture(scope="module")
def engine(saved) -> Engine:
    """The engine of the tiny checkpoint, a 24-token budget chunking the longer prompts."""
    engine = Engine.load(str(saved[0]), EngineConfig(**STAGGERED))
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    return engine


def test_served_text_only() -> None:
    assert unsupported_reason("qwen4_exp") is None
    assert family("qwen4_exp").library is Library.MLX_VLM
    assert family("qwen4_exp").vision is None and family("qwen4_exp").vision_refusal


def test_staggered_batch_with_chunked_prefill(saved, engine: Engine) -> None:
    """Six requests join at different steps, the longer prompts in chunks (contexts up to 66
    tokens, sparse from 16); every token is mlx-vlm's."""
    assert_staggered_text_matches(engine, saved[1], [1, 5, 37, 12, 60, 3], GREEDY)


def test_attention_reads_the_selected_positions_only(saved, engine: Engine, tmp_path) -> None:
    """Log-probabilities are mlx-vlm's sparse ones, and far from those of the same weights
    attending to every position (a budget past the context): an attention that read every
    token fails here, and one that read other tokens than the selection's too; the long prompt
    then resumes from the prefix cache."""
    dense = save_qwen4_exp(tmp_path / "dense", indexer_budget=1 << 12)
    long = assert_sparse_not_dense(engine, saved[1], GREEDY, dense, SPARSE_FROM)
    # the long prompt's blocks (K/V, raw indexer keys) and a recurrent checkpoint resumed
    [again] = engine.generate([long + [5, 6, 7]], GREEDY)
    assert again.metrics.cached_tokens == 32
    assert_matches_mlx_vlm_text(saved[1], long + [5, 6, 7], again)
    assert_pool_idle(engine)


def test_preemption_then_a_restart_from_the_disk_tier(saved, tmp_path: Path) -> None:
    """A pool too small for three requests preempts one (it recomputes: the same tokens); a
    fresh engine over the same disk tier reads a prompt's blocks (K/V, raw indexer keys, and
    the recurrent state at their end) back for a longer prompt, and its tokens stay mlx-vlm's."""
    assert_preemption_then_disk_restart(*saved, GREEDY, tmp_path / "kv")


def test_fp8_indexer_keys_select_as_mlx_vlms_indexer_over_rounded_keys(saved) -> None:
    """``indexer_keys="fp8"`` on QSA's raw keys (the pages' rows, pooled into block summaries
    each step): staggered requests' tokens and log-probabilities are mlx-vlm's with its
    ``QSAKVCache``'s raw keys rounded through the fp8 format, and some request's are not those
    of its float keys (the tiny model's rounding seldom reorders two block scores: seed 1's
    49-token prompt is one where it does)."""
    engine = Engine.load(str(saved[0]), EngineConfig(**STAGGERED, indexer_keys="fp8"))
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    assert_fp8_staggered_matches_mlx_vlm(engine, saved[1], GREEDY, [37, 60, 49, 12, 3, 1], seed=1)
