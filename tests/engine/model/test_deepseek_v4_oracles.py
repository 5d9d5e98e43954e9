"""Which library's DeepSeek V4 a chunked paged step could match (docs/engine.md, "What DeepSeek
V4 ... needs"): mlx-lm's gives the same logits wherever its calls are cut; mlx-vlm's ratio-4
compressed rows change with the cut. A library upgrade that changes either fails here."""

from __future__ import annotations

import mlx.core as mx

from tests.support.deepseek_v4 import row_gaps, tiny_v41, v41_logits, vlm_compressed_rows


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
