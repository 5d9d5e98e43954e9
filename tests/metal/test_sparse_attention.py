"""Sparse attention (``LayerParams.selected``): every backend against the float64 numpy oracle.

Each query row lists a few positions of its own sequence (far fewer than its context, so the
selection drops most tokens). The emulated Metal bodies and the CPU kernel get pages whose every
slot no row both lists and may see is NaN, so reading one more token than the list names shows;
the reference gathers and masks, so it gets finite pages (as in the dense tests).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from macbatch.metal import AttentionBackend, paged_attention_reference, reference, selftest
from macbatch.metal.cpu_kernel import paged_attention_cpu
from macbatch.metal.kernels import MetalKernelBackend, SplitPolicy
from tests.support.attention_cases import (
    TOLERANCE,
    Case,
    emulated_attention,
    query_positions,
    relative_error,
)
from tests.support.kernel_checks import check_backends, kernel_backends
from tests.support.msl.emulator import Emulator

F16, BF16 = mx.float16, mx.bfloat16
# (query heads, KV heads, row width, value width): grouped heads, a narrow latent and MLA's own
SHAPES: dict[str, dict[str, Any]] = {
    "gqa": dict(num_q_heads=4, num_kv_heads=2, head_dim=64),
    "latent_48_36": dict(num_q_heads=16, num_kv_heads=1, head_dim=48, value_dim=36, block_size=8),
    "latent_576_512": dict(num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512),
}
# Decode rows on long contexts and a prefill chunk on 50 cached tokens, in one call.
MIXED = dict(seq_lens=[120, 70, 58, 1], q_lens=[1, 1, 8, 1], top_k=12)


@pytest.mark.parametrize("bits", [None, 8, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_mixed_step_every_shape_and_page_format(shape, bits):
    check_backends(Case(**MIXED, **SHAPES[shape], kv_bits=bits))


CASES = {
    "decode_only_bf16": Case([200, 33, 90], [1, 1, 1], top_k=16, dtype=BF16),
    "chunk_on_cached_context": Case([80], [24], top_k=10, num_q_heads=8, num_kv_heads=2),
    "window_softcap_sinks_f16": Case(
        [150, 60],
        [1, 7],
        top_k=20,
        dtype=F16,
        sliding_window=40,
        softcap=10.0,
        sinks=True,
    ),
    "latent_window_sinks_4bit": Case(
        [90, 40],
        [1, 5],
        top_k=9,
        **SHAPES["latent_48_36"],
        sliding_window=30,
        sinks=True,
        kv_bits=4,
        group_size=16,
    ),
    "latent_20_heads_two_tiles": Case(
        [64, 30],
        [1, 3],
        top_k=8,
        **{**SHAPES["latent_48_36"], "num_q_heads": 20},
    ),
    "short_context_lists_fewer": Case([5, 70], [1, 1], top_k=16, block_size=32),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cases(name):
    check_backends(CASES[name])


def test_split_kv_over_the_selected_entries():
    """Long lists over few work items are split across threadgroups and merged."""
    case = Case([400, 90], [1, 1], top_k=64, sinks=True, seed=2)
    emulator = Emulator()
    backend = MetalKernelBackend(emulator.metal_kernel, SplitPolicy(min_keys=16, max_splits=4))
    got = backend(*case.args(poisoned=True))
    assert relative_error(got, case.oracle()) <= TOLERANCE[case.dtype]
    assert emulator.dispatches[-1].threadgroups > 4  # 2 seqs x 2 KV heads, split


def test_the_kernels_do_not_defer_to_the_reference(monkeypatch):
    def refused(*args):
        raise AssertionError("the reference's sparse form ran")

    monkeypatch.setattr(reference, "_listed_attention", refused)
    case = Case(**MIXED, **SHAPES["latent_48_36"], kv_bits=8)
    for name, backend in kernel_backends().items():
        got = backend(*case.args(poisoned=True))
        assert relative_error(got, case.oracle()) <= TOLERANCE[case.dtype], name


def test_poison_catches_a_kernel_that_reads_every_token():
    """The same poisoned pages through the dense path give NaN: the sparse tests above would
    fail for a kernel that read the whole context (and are finite and right for the sparse one)."""
    case = Case(**MIXED, **SHAPES["gqa"])
    q, k, v, meta, layer = case.args(poisoned=True)
    for name, backend in kernel_backends().items():
        dense = backend(q, k, v, meta, layer._replace(selected=None))
        assert np.isnan(np.array(dense.astype(mx.float32))).any(), name
        sparse = np.array(backend(q, k, v, meta, layer).astype(mx.float32))
        assert np.isfinite(sparse).all(), name


@pytest.mark.parametrize("shape", ["gqa", "latent_48_36"])
def test_a_few_other_positions_give_the_other_answer(shape):
    """Lists that differ in two entries of some rows give different outputs for exactly those
    rows, each matching numpy: a kernel reading the wrong positions fails one of them."""
    case = Case(**MIXED, **SHAPES[shape], seed=5)
    other, changed = _swap_two_entries(case)
    want, want_other = case.oracle(), case.oracle(other)
    rows_changed = np.abs(want - want_other)[changed].max(axis=(1, 2))
    assert (rows_changed > 1e-3).all()  # the change matters to numpy
    every = {**kernel_backends(), "reference": paged_attention_reference}
    for name, backend in every.items():
        got = backend(*case.args(poisoned=False))
        got_other = backend(*case.args(poisoned=False, selected=other))
        assert relative_error(got, want) <= 1e-5, name
        assert relative_error(got_other, want_other) <= 1e-5, name


def _swap_two_entries(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The case's selection with two listed visible positions of every row that has room
    replaced by positions it does not list; and which rows changed."""
    rng = np.random.default_rng(1)
    assert case.selected is not None
    other = case.selected.copy()
    changed = []
    for i, (_, pos) in enumerate(query_positions(case.lens, case.q_lens)):
        listed = set(other[i].tolist())
        free = [t for t in range(pos) if t not in listed]
        entries = [e for e in range(other.shape[1]) if 0 <= other[i, e] < pos]
        if len(free) < 2 or len(entries) < 2:
            continue  # only rows with room to change
        other[i, rng.choice(entries, 2, replace=False)] = rng.choice(free, 2, replace=False)
        changed.append(i)
    assert changed
    return other, np.array(changed)


@pytest.mark.parametrize(
    "shape,bits,row_bytes",
    [
        ("gqa", None, 2 * 64 * 2),  # K and V rows, float16
        ("gqa", 4, 2 * (64 // 2 + 64 // 32 * 2 * 2)),  # 4-bit codes and (scale, bias) pairs
        ("latent_576_512", None, 576 * 2),  # one latent row serves keys and values
        ("latent_576_512", 4, 576 // 2 + 576 // 64 * 2 * 2),
    ],
)
def test_sparse_decode_reads_only_the_listed_rows(shape, bits, row_bytes):
    """Through the emulator's byte count: a decode reads each listed visible row of each KV head
    once, and nothing else, however long the context."""
    case = Case(
        [300, 130, 77], [1, 1, 1], top_k=16, dtype=F16, kv_bits=bits,
        group_size=32 if bits and shape == "gqa" else None, **SHAPES[shape],
    )  # fmt: skip
    emulator = Emulator()
    emulated_attention(emulator)(*case.args(poisoned=True))
    listed = int(sum((row >= 0).sum() for row in case.selected))  # decode rows see all they list
    kv_heads = SHAPES[shape]["num_kv_heads"]
    assert emulator.dispatches[-1].bytes_read == listed * kv_heads * row_bytes


def test_selftest_rejects_a_backend_that_ignores_the_selection():
    class Dense(AttentionBackend):
        name = "dense"
        label = "dense"

        def __call__(self, q, k, v, meta, layer, /):
            return paged_attention_reference(q, k, v, meta, layer._replace(selected=None))

    ok, why = selftest(Dense())
    assert not ok and "sparse" in why and "max error" in why


def test_selftest_rejects_a_kernel_that_reads_the_wrong_positions():
    """The Metal body treating list entries as positions (entry e read as key e)."""
    factory = Emulator().metal_kernel

    def mutated(**kw):
        kw["header"] = kw["header"].replace("const int key = selected[list_base + e];",
                                            "const int key = e;")  # fmt: skip
        return factory(**kw)

    ok, why = selftest(MetalKernelBackend(mutated))
    assert not ok and "sparse" in why


def test_a_selection_of_the_wrong_shape_is_refused():
    q, k, v, meta, layer = Case(**MIXED, **SHAPES["gqa"]).args(poisoned=False)
    with pytest.raises(ValueError, match="selected"):
        mx.eval(paged_attention_cpu(q, k, v, meta, layer._replace(selected=layer.selected[1:])))
    with pytest.raises(ValueError, match="selected"):
        emulated_attention()(q, k, v, meta, layer._replace(selected=layer.selected[:, :0]))
