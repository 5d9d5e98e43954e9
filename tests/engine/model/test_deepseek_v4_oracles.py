"""Which library's DeepSeek V4 a chunked paged step could match (docs/engine.md, "What DeepSeek
V4 ... needs"): mlx-lm's V4.1 gives the same logits wherever its calls are cut; mlx-vlm's V4
ratio-4 compressed rows change with the cut, unless its pooling cache keeps the previous group
as DeepSeek's reference does (the engine's ``ReferencePoolingCache``); and a V4 checkpoint's
weights do not fit mlx-lm's V4.1 model. A library upgrade that changes any of it fails here."""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten

from macbatch.engine.model.overlap_pooling import ReferencePoolingCache
from tests.support.deepseek_v4 import row_gaps, tiny_v41, v41_logits, vlm_compressed_rows
from tests.support.tiny_deepseek_v4 import deepseek_v4_model


def test_mlx_lm_v41_logits_do_not_depend_on_where_calls_are_cut() -> None:
    model = tiny_v41()
    tokens = mx.random.randint(0, 64, (1, 48), key=mx.random.key(7))
    whole = v41_logits(model, tokens, [])
    for cuts in ([13, 30], list(range(1, 48))):
        assert row_gaps(v41_logits(model, tokens, cuts), whole).max() < 1e-5, cuts
    assert row_gaps(whole, mx.zeros_like(whole)).max() > 0.1  # not a degenerate model


def test_mlx_vlm_overlapping_compression_depends_on_the_cut() -> None:
    whole = vlm_compressed_rows(4, 16, [])
    one_by_one = vlm_compressed_rows(4, 16, list(range(1, 16)))
    assert whole.shape == one_by_one.shape == (1, 4, 16)
    gaps = row_gaps(whole, one_by_one)
    # the first group has no previous one either way; every later row loses its overlap
    assert gaps[0] < 1e-5
    assert gaps[1:].min() > 1e-2
    # without overlap (ratio 128) the rows are the same however the calls are cut
    cut = row_gaps(vlm_compressed_rows(128, 512, []), vlm_compressed_rows(128, 512, [200, 300]))
    assert cut.max() < 1e-5


def test_keeping_the_previous_group_makes_the_rows_the_same_however_calls_are_cut() -> None:
    """The engine's pooling cache: every cut, token by token too, gives one whole call's rows
    (each group pooled with its real previous group, as the reference's prefill pools them)."""
    whole = vlm_compressed_rows(4, 16, [])
    for cuts in ([9], [1, 2, 3, 5, 8, 13], list(range(1, 16))):
        rows = vlm_compressed_rows(4, 16, cuts, cache_kind=ReferencePoolingCache)
        assert row_gaps(rows, whole).max() < 1e-5, cuts


def test_a_v4_checkpoint_does_not_fit_mlx_lm_v41() -> None:
    """What a V4 layer holds that V4.1's has no place for (so V4 checkpoints cannot be routed to
    mlx-lm's ``deepseek_v41``): a ratio-4 compressor's doubled projections (the overlap) and
    learned position bias, an indexer with a compressor of its own (V4.1 projects its keys from
    the compressed rows), a token-id routing table, and the hyper-connections' head."""
    v4 = dict(tree_flatten(deepseek_v4_model().language_model.parameters()))
    v41 = dict(tree_flatten(tiny_v41().parameters()))
    head_dim = 32  # both tiny models'
    assert v4["model.layers.1.attn.compressor.wkv.weight"].shape[0] == 2 * head_dim
    assert v41["model.layers.1.self_attn.compressor.kv_proj.weight"].shape[0] == head_dim
    assert "model.layers.1.attn.compressor.ape" in v4
    assert "model.layers.1.attn.indexer.compressor.wkv.weight" in v4
    assert "model.layers.1.self_attn.indexer.k_proj.weight" in v41
    assert "model.layers.0.ffn.gate.tid2eid" in v4
    assert "model.hc_head.fn" in v4
    v41_names = " ".join(v41)
    for part in ("ape", "tid2eid", "hc_head", "indexer.compressor"):
        assert part not in v41_names, part
