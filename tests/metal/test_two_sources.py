"""A second source of rows (``LayerParams.rows``, DeepSeek V4's compressed rows): the emulated
Metal latent body, the CPU kernel and the reference against the float64 numpy oracle.

Each query row lists a few rows of its own sequence's row pages (some -1, none at all for a
sequence without rows), read after its token entries in the same softmax. The kernels get row
pages whose every slot no row lists is NaN (and token pages poisoned as in the sparse tests), so
a kernel reading one row too many shows NaN; one ignoring the rows misses the oracle.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from macbatch.metal import AttentionBackend, paged_attention_reference, selftest
from macbatch.metal.kernels import MetalKernelBackend, SplitPolicy
from tests.support.attention_cases import TOLERANCE, Case, emulated_attention, relative_error
from tests.support.kernel_checks import CpuKernel, check_backends
from tests.support.msl.emulator import Emulator

F16, BF16 = mx.float16, mx.bfloat16
LATENT: dict[str, Any] = dict(
    num_q_heads=16, num_kv_heads=1, head_dim=48, value_dim=36, block_size=8
)
# Decodes on long contexts, a prefill chunk on cached context and a sequence with no rows; 12
# token entries (not whole chunks of 8) then 6 row entries per query row.
MIXED: dict[str, Any] = dict(
    seq_lens=[120, 70, 58, 9], q_lens=[1, 1, 8, 1], top_k=12,
    row_counts=[30, 17, 14, 0], row_top_k=6, **LATENT,
)  # fmt: skip


@pytest.mark.parametrize(
    "dtype, bits", [(mx.float32, None), (BF16, None), (mx.float32, 8), (mx.float32, 4)]
)
def test_mixed_step_every_page_format(dtype, bits):
    check_backends(Case(**MIXED, dtype=dtype, kv_bits=bits, group_size=16 if bits else None))


CASES = {
    "mla_576_512_f16": Case(
        [90, 40], [1, 3], top_k=10, row_counts=[20, 9], row_top_k=5, dtype=F16,
        num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512,
    ),
    "window_softcap_sinks_f16": Case(
        [150, 60], [1, 7], top_k=20, row_counts=[36, 15], row_top_k=8, dtype=F16,
        sliding_window=40, softcap=10.0, sinks=True, **LATENT,
    ),
    "dense_tokens_in_a_window_with_rows": Case(
        [100, 30], [1, 6], row_counts=[24, 7], row_top_k=6, sliding_window=16, sinks=True,
        **LATENT,
    ),
    # DeepSeek V4's shape: 512-wide rows, all of them values, a dense window and sinks
    "deepseek_v4_window_512_bf16": Case(
        [200, 40], [1, 5], row_counts=[50, 10], row_top_k=12, sliding_window=32, sinks=True,
        dtype=BF16, num_q_heads=16, num_kv_heads=1, head_dim=512, value_dim=512,
    ),
    "no_rows_anywhere": Case([50, 20], [1, 4], top_k=8, row_counts=[0, 0], row_top_k=4, **LATENT),
    "20_heads_two_tiles_4bit": Case(
        [64, 30], [1, 3], top_k=8, row_counts=[12, 5], row_top_k=4, kv_bits=4, group_size=16,
        **{**LATENT, "num_q_heads": 20},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_cases(name):
    check_backends(CASES[name])


@pytest.mark.parametrize("bits", [None, 4])
def test_split_parts_over_tokens_and_rows(bits):
    """Long lists over few work items: the parts divide the token entries and the rows, and the
    merge (with sinks) joins them."""
    case = Case(
        [400, 90], [1, 1], top_k=40, row_counts=[90, 20], row_top_k=24, sinks=True, seed=2,
        kv_bits=bits, group_size=16 if bits else None, **LATENT,
    )  # fmt: skip
    emulator = Emulator()
    backend = MetalKernelBackend(emulator.metal_kernel, SplitPolicy(min_keys=8, max_splits=4))
    got = backend(*case.args(poisoned=True))
    assert relative_error(got, case.oracle()) <= TOLERANCE[case.dtype]
    assert emulator.dispatches[-1].threadgroups == 2 * 4  # 2 decode items, 4 parts each


@pytest.mark.parametrize("bits, row_bytes", [(None, 576 * 2), (4, 576 // 2 + 576 // 64 * 2 * 2)])
def test_a_decode_reads_each_listed_token_and_row_once(bits, row_bytes):
    """Through the emulator's byte count (576-wide float16 or 4-bit rows): a decode reads the
    listed tokens' rows and the listed rows, each once, and nothing else."""
    case = Case(
        [300, 130, 77], [1, 1, 1], top_k=16, row_counts=[40, 21, 3], row_top_k=8, dtype=F16,
        kv_bits=bits, num_q_heads=16, num_kv_heads=1, head_dim=576, value_dim=512,
    )  # fmt: skip
    emulator = Emulator()
    emulated_attention(emulator)(*case.args(poisoned=True))
    assert case.selected is not None and case.row_source is not None
    listed = int((case.selected >= 0).sum() + (case.row_source.selected >= 0).sum())
    assert emulator.dispatches[-1].bytes_read == listed * row_bytes


def test_other_rows_give_the_other_answer():
    """Lists naming other rows of the same sequence change the output of exactly those query
    rows, each matching numpy: a kernel reading the wrong rows fails one of them."""
    case = Case(**MIXED)
    other = _other_rows(case)
    changed = (other != case.row_source.selected).any(axis=1)
    want, want_other = case.oracle(), case.oracle(rows=other)
    assert changed.any() and (np.abs(want - want_other)[changed].max(axis=(1, 2)) > 1e-3).all()
    backend = emulated_attention()
    got = backend(*case.args(poisoned=False, rows=other, poison_rows=False))
    assert relative_error(got, want_other) <= TOLERANCE[case.dtype]


def _other_rows(case: Case) -> np.ndarray:
    """Each query row's list with its first listed row replaced by one of its sequence's rows
    it does not list (where there is one)."""
    assert case.row_source is not None and case.row_counts is not None
    lists = case.row_source.selected.copy()
    seq_of_row = np.repeat(np.arange(len(case.q_lens)), case.q_lens)
    for i, s in enumerate(seq_of_row):
        unlisted = sorted(set(range(case.row_counts[s])) - set(lists[i].tolist()))
        first = np.flatnonzero(lists[i] >= 0)
        if unlisted and first.size:
            lists[i, first[0]] = unlisted[0]
    return lists


def test_the_metal_kernel_refuses_rows_beside_grouped_heads():
    case = Case([40, 20], [1, 3], top_k=8)
    q, k, v, meta, layer = case.args(poisoned=False)
    rows = Case(**MIXED).row_source
    assert rows is not None
    source = rows.source(False)
    with pytest.raises(ValueError, match="second source"):
        emulated_attention()(q, k, v, meta, layer._replace(rows=source))


def test_selftest_passes_both_kernels_on_rows():
    assert selftest(emulated_attention()) == (True, "")
    assert selftest(CpuKernel()) == (True, "")


def test_selftest_rejects_a_backend_that_ignores_the_rows():
    class TokensOnly(AttentionBackend):
        name = "tokens-only"
        label = "tokens only"

        def __call__(self, q, k, v, meta, layer, /):
            return paged_attention_reference(q, k, v, meta, layer._replace(rows=None))

    ok, why = selftest(TokensOnly())
    assert not ok and "sparse+rows" in why and "max error" in why


def test_selftest_rejects_a_metal_body_that_skips_the_rows():
    factory = Emulator().metal_kernel

    def mutated(**kw):
        kw["header"] = kw["header"].replace("return live ? row_selected[list_base + e] : -1;",
                                            "return -1;")  # fmt: skip
        return factory(**kw)

    ok, why = selftest(MetalKernelBackend(mutated))
    assert not ok and "sparse+rows" in why
