"""GLM5-next (mlx-vlm's ``glm5_next``) through the packed, paged step: its pooling indexer (each
token's key and gate paged beside the latent, each row's best pools and the tail after its last
whole pool read alone), a layer sharing that selection, Gated DeltaNet over a short convolution
through mlx-vlm's own recurrent cache calls, four residual streams and MoE. Greedy tokens and
log-probabilities equal mlx-vlm's own generation on a tiny random model whose selection drops
positions of any context past ``SPARSE_FROM`` tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.indexer_keys import IndexerKeysGroup
from macbatch.engine.model.families import Library, family, unsupported_reason
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import STAGGERED
from tests.support.tiny_glm5_next import SPARSE_FROM, save_glm5_next
from tests.support.vlm_oracle import (
    assert_fp8_staggered_matches_mlx_vlm,
    assert_matches_mlx_vlm_text,
    assert_preemption_then_disk_restart,
    assert_sparse_not_dense,
    assert_staggered_text_matches,
)

pytest.importorskip("mlx_vlm")

GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, object]:
    """The tiny checkpoint and mlx-vlm's own model of it."""
    from mlx_vlm.utils import load_model

    path = save_glm5_next(tmp_path_factory.mktemp("glm5_next"))
    return path, load_model(path)


@pytest.fixture(scope="module")
def engine(saved) -> Engine:
    """The engine of the tiny checkpoint, a 24-token budget chunking the longer prompts."""
    engine = Engine.load(str(saved[0]), EngineConfig(**STAGGERED))
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    return engine


def test_served_text_only() -> None:
    assert unsupported_reason("glm5_next") is None
    assert family("glm5_next").library is Library.MLX_VLM
    assert family("glm5_next").vision is None and family("glm5_next").vision_refusal


def test_staggered_batch_with_chunked_prefill(saved, engine: Engine) -> None:
    """Five requests join at different steps, the longer prompts in chunks (contexts up to 54
    tokens, sparse from 12); every token is mlx-vlm's."""
    assert_staggered_text_matches(engine, saved[1], [1, 5, 37, 13, 49], GREEDY)


def test_attention_reads_the_selected_positions_only(saved, engine: Engine, tmp_path) -> None:
    """Log-probabilities are mlx-vlm's sparse ones, and far from those of the same weights
    attending to every position (a top-k past the context): an attention that read every token
    fails here, and one that read other tokens than the selection's too; the long prompt then
    resumes from the prefix cache (its latent, indexer keys and gates, recurrent state)."""
    dense = save_glm5_next(tmp_path / "dense", index_topk=1 << 12)
    long = assert_sparse_not_dense(engine, saved[1], GREEDY, dense, SPARSE_FROM)
    [again] = engine.generate([long + [5, 6, 7]], GREEDY)
    assert again.metrics.cached_tokens == 32
    assert_matches_mlx_vlm_text(saved[1], long + [5, 6, 7], again)
    assert_pool_idle(engine)


def test_preemption_then_a_restart_from_the_disk_tier(saved, tmp_path: Path) -> None:
    """A pool too small for three requests preempts one (it recomputes: the same tokens); a
    fresh engine over the same disk tier reads a prompt's blocks (latent, indexer keys and
    gates, and the recurrent state at their end) back for a longer prompt, and its tokens stay
    mlx-vlm's."""
    assert_preemption_then_disk_restart(*saved, GREEDY, tmp_path / "kv")


def test_fp8_indexer_keys_select_as_mlx_vlms_indexer_over_rounded_keys(saved) -> None:
    """``indexer_keys="fp8"`` on the pooling indexer's page rows (each token's key and pooling
    gate side by side: one row of the format, one scale for both on this 16-wide key):
    staggered requests' tokens and log-probabilities are mlx-vlm's with the key and gate its
    ``PoolingCache`` is handed rounded through the fp8 format, and some request's are not those
    of its float keys (an oracle rounding the key alone fails too, tried)."""
    engine = Engine.load(str(saved[0]), EngineConfig(**STAGGERED, indexer_keys="fp8"))
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    assert_fp8_staggered_matches_mlx_vlm(engine, saved[1], GREEDY, [1, 5, 37, 13, 49])
