"""The C++ CPU attention kernel against the float64 numpy oracle and the pure-MLX reference.

The first test builds the kernel (about 15 s on 2 cores) unless this exact build is cached.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.metal import AttentionMetadata, LayerParams, cpu_kernel
from macbatch.metal.cpu_kernel import CpuKernelUnavailable, paged_attention_cpu
from macbatch.metal.reference import paged_attention_reference
from tests.support.attention_numpy import CASES, paged_attention_numpy, random_paged_case


def _run(case, dtype=mx.float32, **options):
    q, k, v, tables, lens, cu = case
    sinks = options.pop("sinks", None)
    layer = LayerParams(**options, sinks=None if sinks is None else mx.array(sinks))
    got = paged_attention_cpu(
        mx.array(q, dtype=dtype),
        mx.array(k, dtype=dtype),
        mx.array(v, dtype=dtype),
        AttentionMetadata.build(tables, lens, cu),
        layer,
    )
    assert got.dtype == dtype
    return np.array(got.astype(mx.float32))


def _numpy(case, **options):
    return paged_attention_numpy(*case, **options)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (8, 2), (16, 2)])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [24, 32])  # values 8 or 16 columns at a time
def test_matches_numpy(case, hq, hkv, block_size, head_dim):
    data = random_paged_case(*CASES[case], hq=hq, hkv=hkv, d=head_dim, block_size=block_size)
    want = _numpy(data, scale=0.25)
    np.testing.assert_allclose(_run(data, scale=0.25), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "window,softcap,with_sinks",
    [(4, None, False), (9, None, False), (None, 5.0, False), (None, None, True), (3, 2.0, True)],
)
def test_window_softcap_sinks(window, softcap, with_sinks):
    data = random_paged_case([1, 6, 1, 3, 20], [10, 6, 4, 11, 40], hq=4, hkv=2, d=16, block_size=8)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32) if with_sinks else None
    options = dict(scale=0.3, sliding_window=window, softcap=softcap, sinks=sinks)
    np.testing.assert_allclose(_run(data, **options), _numpy(data, **options), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(mx.float16, 3e-3), (mx.bfloat16, 2e-2)])
def test_half_precision_pages(dtype, tol):
    data = random_paged_case([1, 7, 1, 3], [10, 7, 30, 19], hq=4, hkv=2, d=64, block_size=16)
    rounded = [np.array(mx.array(a).astype(dtype).astype(mx.float32)) for a in data[:3]]
    want = _numpy((*rounded, *data[3:]), scale=0.125)
    np.testing.assert_allclose(_run(data, dtype, scale=0.125), want, rtol=tol, atol=tol)


def test_strided_queries():
    """q as the model produces it: a transposed view, not row-contiguous."""
    q, k, v, tables, lens, cu = random_paged_case([3, 1], [3, 9], hq=4, hkv=2, d=16, block_size=8)
    q_view = mx.array(np.ascontiguousarray(q.transpose(1, 0, 2))).transpose(1, 0, 2)
    meta = AttentionMetadata.build(tables, lens, cu)
    got = paged_attention_cpu(q_view, mx.array(k), mx.array(v), meta, LayerParams(0.5))
    want = paged_attention_numpy(q, k, v, tables, lens, cu, scale=0.5)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


def test_long_prefill_on_several_threads_matches_reference():
    """Enough query tiles that the work is split across threads."""
    data = random_paged_case([300, 1, 1], [340, 77, 5], hq=8, hkv=4, d=64, block_size=16, seed=3)
    args = (
        *(mx.array(a) for a in data[:3]),
        AttentionMetadata.build(*data[3:]),
        LayerParams(0.125),
    )
    want = paged_attention_reference(*args)
    np.testing.assert_allclose(
        np.array(paged_attention_cpu(*args)), np.array(want), rtol=1e-5, atol=1e-5
    )


def test_rows_never_see_other_sequences():
    q, k, v, tables, lens, cu = random_paged_case([1, 4], [6, 4], hq=2, hkv=2, block_size=8)
    before = _run((q, k, v, tables, lens, cu), scale=0.5)
    k[tables[1, :1]] = 1e4
    v[tables[1, :1]] = -1e4
    after = _run((q, k, v, tables, lens, cu), scale=0.5)
    np.testing.assert_array_equal(before[:1], after[:1])
    assert not np.allclose(before[1:], after[1:])


def test_unsupported_shapes_use_the_reference():
    data = random_paged_case([2, 1], [5, 9], hq=2, hkv=2, d=12, block_size=4)
    np.testing.assert_allclose(_run(data, scale=0.5), _numpy(data, scale=0.5), rtol=1e-5, atol=1e-5)


def test_a_failed_build_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_kernel, "_loaded", {})
    monkeypatch.setenv("MACBATCH_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(CpuKernelUnavailable, match="failed to compile"):
        cpu_kernel.load_extension()
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(CpuKernelUnavailable, match="no C\\+\\+ compiler"):
        cpu_kernel.load_extension()
    monkeypatch.delenv("CXX")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MACBATCH_CACHE", str(tmp_path / "file"))  # not a directory
    with pytest.raises(CpuKernelUnavailable, match="cannot build in"):
        cpu_kernel.load_extension()


def test_metadata_in_any_form_gives_the_same_result():
    """Host-built int32 arrays go in as they are; other dtypes, arrays still to be computed and
    strided views are made int32 (by `AttentionMetadata.build`) and contiguous (by the kernel)
    first: every form reads the same metadata."""
    q, k, v, tables, lens, cu = random_paged_case([1, 5, 2], [9, 5, 30], hq=4, hkv=2, block_size=8)
    want = paged_attention_numpy(q, k, v, tables, lens, cu, scale=0.5)
    as_host_int32 = [mx.array(np.asarray(a, dtype=np.int32)) for a in (tables, lens, cu)]
    as_int64 = [mx.array(np.asarray(a, dtype=np.int64)) for a in (tables, lens, cu)]
    lazy = [a + 0 for a in as_host_int32]  # computed by the step's graph, not yet evaluated
    strided_tables = mx.array(np.ascontiguousarray(np.asarray(tables, np.int32).T)).T
    forms = [as_host_int32, as_int64, lazy, [strided_tables, *as_host_int32[1:]]]
    for metadata in forms:
        meta = AttentionMetadata.build(*metadata)
        got = paged_attention_cpu(mx.array(q), mx.array(k), mx.array(v), meta, LayerParams(0.5))
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


# MLA's latent pages: one KV head whose rows are Dk wide, the values their leading Dv columns
# (the caller passes the key pages as values too). (Dk, Dv, query heads): the real width with
# few heads, narrow rows under many heads (a group wider than one work item), and a value width
# that is no multiple of the 8-float vector.
LATENT_SHAPES = [(576, 512, 16), (80, 64, 16), (40, 32, 128), (48, 36, 16)]


@pytest.fixture
def kernel_only(monkeypatch):
    """The kernel must compute latent layers itself: handing one to the reference fails."""

    def refuse(*args):
        raise AssertionError("the CPU kernel handed a latent layer to the reference")

    monkeypatch.setattr(cpu_kernel, "paged_attention_reference", refuse)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dk,dv,hq", LATENT_SHAPES)
def test_latent_pages_match_numpy(case, dk, dv, hq, kernel_only):
    q, k, _, tables, lens, cu = random_paged_case(
        *CASES[case], hq=hq, hkv=1, d=dk, block_size=16, seed=dk
    )
    pages = mx.array(k)
    layer = LayerParams(0.1, value_dim=dv)
    got = paged_attention_cpu(
        mx.array(q), pages, pages, AttentionMetadata.build(tables, lens, cu), layer
    )
    want = paged_attention_numpy(q, k, k[..., :dv], tables, lens, cu, scale=0.1)
    assert got.shape == (q.shape[0], hq, dv)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hq", [16, 128])
def test_long_latent_decode_split_across_heads_matches_reference(hq, monkeypatch):
    """One sequence's decode over a long context with the query heads sliced across work items
    (all of them share the one latent head), beside a prefill chunk, in bfloat16."""
    data = random_paged_case([1, 20], [700, 60], hq=hq, hkv=1, d=576, block_size=32, seed=hq)
    q, k, _, tables, lens, cu = data
    pages = mx.array(k, dtype=mx.bfloat16)
    args = (mx.array(q, dtype=mx.bfloat16), pages, pages, AttentionMetadata.build(tables, lens, cu))
    layer = LayerParams(576**-0.5, value_dim=512)
    want = paged_attention_reference(*args, layer).astype(mx.float32)
    monkeypatch.setattr(cpu_kernel, "paged_attention_reference", None)  # never the fallback
    got = paged_attention_cpu(*args, layer).astype(mx.float32)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=2e-2, atol=2e-2)


def test_latent_pages_with_window_softcap_sinks(kernel_only):
    """No MLA model has them, but the kernel reads them on latent layers as on any other."""
    q, k, _, tables, lens, cu = random_paged_case(
        [1, 6, 1, 3, 20], [10, 6, 4, 11, 40], hq=16, hkv=1, d=80, block_size=8, seed=5
    )
    sinks = np.linspace(-1.0, 2.0, 16).astype(np.float32)
    layer = LayerParams(0.3, 4, 2.0, mx.array(sinks), value_dim=64)
    pages = mx.array(k)
    got = paged_attention_cpu(
        mx.array(q), pages, pages, AttentionMetadata.build(tables, lens, cu), layer
    )
    want = paged_attention_numpy(
        q, k, k[..., :64], tables, lens, cu, scale=0.3, sliding_window=4, softcap=2.0, sinks=sinks
    )
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)
