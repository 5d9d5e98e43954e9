"""Hunyuan V4 (mlx-vlm's ``hy_v4``) through the packed, paged step: DeepSeek Sparse Attention's
machinery with the lightning indexer's keys paged for its "full" layers only, its "shared"
layers attending to the rows the last full layer selected, per-head attention sinks in the
sparse latent kernel, a per-value output gate and four residual streams. Greedy tokens and
log-probabilities equal mlx-vlm's own generation (its indexer's partition evaluated per call:
``tests/support/tiny_hy_v4.py``) on a tiny random model whose top-12 selection drops
positions."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.indexer_keys import IndexerKeysGroup
from macbatch.engine.model.families import Library, family, unsupported_reason
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import STAGGERED
from tests.support.tiny_hy_v4 import INDEX_TOPK, partition_per_call, save_hy_v4
from tests.support.vlm_oracle import (
    assert_fp8_staggered_matches_mlx_vlm,
    assert_sparse_not_dense,
    assert_staggered_matches_mlx_vlm,
)

pytest.importorskip("mlx_vlm")

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module", autouse=True)
def _partition_fixed():
    with partition_per_call():
        yield


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, object]:
    """The tiny checkpoint and mlx-vlm's own model of it."""
    from mlx_vlm.utils import load_model

    path = save_hy_v4(tmp_path_factory.mktemp("hy_v4"))
    return path, load_model(path)


def test_served() -> None:
    assert unsupported_reason("hy_v4") is None
    assert family("hy_v4").library is Library.MLX_VLM


def test_staggered_batch_with_chunked_prefill_and_prefix_hits(saved) -> None:
    """Nine requests join at different steps; a 24-token budget chunks the longer prompts
    (contexts up to 70 tokens select 12); the two longest asked again read their prefixes from
    the prefix cache; every token and log-probability is mlx-vlm's."""
    path, oracle = saved
    engine = Engine.load(str(path), EngineConfig(**STAGGERED))
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    assert_staggered_matches_mlx_vlm(engine, oracle, GREEDY, "hy_v4")
    assert_pool_idle(engine)


def test_attention_reads_the_selected_rows_only(saved, tmp_path: Path) -> None:
    """Log-probabilities are mlx-vlm's sparse ones, and far from those of the same weights
    attending to every position (``index_topk`` past the context): an attention that read every
    token fails here."""
    path, oracle = saved
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, block_size=8))
    dense = save_hy_v4(tmp_path / "dense", index_topk=1 << 30)
    assert_sparse_not_dense(engine, oracle, GREEDY, dense, INDEX_TOPK)
    assert_pool_idle(engine)


def test_fp8_indexer_keys_select_as_mlx_vlms_indexer_over_rounded_keys(saved) -> None:
    """``indexer_keys="fp8"`` on the "full" layers' keys: nine staggered requests' tokens and
    log-probabilities are mlx-vlm's with its indexer-key caches rounded through the fp8 format
    (``tests/support/fp8_numpy.py``), and some request's are not those of its float keys, so an
    engine that kept the keys unrounded (or rounded them otherwise) fails."""
    path, oracle = saved
    engine = Engine.load(str(path), EngineConfig(**STAGGERED, indexer_keys="fp8"))
    assert isinstance(engine.kv.full, IndexerKeysGroup)
    assert_fp8_staggered_matches_mlx_vlm(engine, oracle, GREEDY, [1, 5, 37, 12, 3, 60, 8, 25, 2])
