"""The pure-MLX reference attention against the float64 numpy oracle."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.metal import AttentionMetadata, LayerParams, QuantizedPages
from macbatch.metal.reference import paged_attention_reference
from tests.support.attention_numpy import (
    CASES,
    dequantize_numpy,
    paged_attention_numpy,
    quantize_numpy,
    random_paged_case,
)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (8, 2)])
def test_matches_numpy(case, hq, hkv):
    q, k, v, tables, lens, cu = random_paged_case(*CASES[case], hq=hq, hkv=hkv)
    got = _reference(q, k, v, tables, lens, cu, LayerParams(0.25))
    want = paged_attention_numpy(q, k, v, tables, lens, cu, scale=0.25)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "window,softcap,with_sinks",
    [(4, None, False), (None, 5.0, False), (None, None, True), (3, 2.0, True)],
)
def test_window_softcap_sinks(window, softcap, with_sinks):
    q, k, v, tables, lens, cu = random_paged_case([1, 6, 1, 3], [10, 6, 4, 11], hq=4, hkv=2, seed=1)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32) if with_sinks else None
    layer = LayerParams(0.3, window, softcap, mx.array(sinks) if sinks is not None else None)
    got = _reference(q, k, v, tables, lens, cu, layer)
    want = paged_attention_numpy(
        q, k, v, tables, lens, cu, scale=0.3, sliding_window=window, softcap=softcap, sinks=sinks
    )
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


def test_rows_never_see_other_sequences():
    """Poisoning another sequence's pages leaves a sequence's output untouched."""
    q, k, v, tables, lens, cu = random_paged_case([1, 4], [6, 4], hq=2, hkv=2)
    before = np.array(_reference(q, k, v, tables, lens, cu, LayerParams(0.5)))
    k[tables[1, :1]] = 1e4
    v[tables[1, :1]] = -1e4
    after = np.array(_reference(q, k, v, tables, lens, cu, LayerParams(0.5)))
    np.testing.assert_array_equal(before[:1], after[:1])
    assert not np.allclose(before[1:], after[1:])


def _reference(q, k, v, tables, lens, cu, layer: LayerParams) -> mx.array:
    """The reference on a numpy case (``random_paged_case``'s arrays)."""
    meta = AttentionMetadata.build(tables, lens, cu)
    return paged_attention_reference(mx.array(q), mx.array(k), mx.array(v), meta, layer)


@pytest.mark.parametrize("case", ["decode", "mixed", "prefill_chunk_after_cache"])
@pytest.mark.parametrize("kv_bits", [None, 8, 4])
def test_latent_pages(case, kv_bits):
    """MLA's latent pages: one KV head of 40-wide rows whose first 32 columns are the values;
    the oracle is handed those columns as separate value pages."""
    q, k, _, tables, lens, cu = random_paged_case(*CASES[case], hq=8, hkv=1, d=40, seed=3)
    pages: mx.array | QuantizedPages = mx.array(k)
    if kv_bits is not None:
        codes, scales = quantize_numpy(k, kv_bits, 8)
        k = dequantize_numpy(codes, scales, kv_bits).astype(np.float32)
        pages = QuantizedPages(mx.array(codes), mx.array(scales), kv_bits, 8)
    meta = AttentionMetadata.build(tables, lens, cu)
    layer = LayerParams(0.2, value_dim=32)
    got = paged_attention_reference(mx.array(q), pages, pages, meta, layer)
    want = paged_attention_numpy(q, k, k[..., :32], tables, lens, cu, scale=0.2)
    assert got.shape == (q.shape[0], 8, 32)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)
